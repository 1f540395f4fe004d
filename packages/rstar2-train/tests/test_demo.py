"""``rstar2-train demo --quick``: every stage runs, its outputs exist, the table is printed, and
a second invocation skips finished work and resumes interrupted work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rstar2_data import load_built
from rstar2_train.cli import app
from rstar2_train.config.loader import dump_config
from rstar2_train.demo import DemoOptions, DemoPaths, DemoSummary
from rstar2_train.demo.pipeline import _same_config
from rstar2_train.demo.plan import QUICK_HELDOUT, rl_config
from rstar2_train.run_dir import RunDir

runner = CliRunner()


def _demo(out: Path) -> str:
    result = runner.invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    return result.output


def _demo_streams(out: Path) -> tuple[str, str]:
    """stdout and stderr of the demo as a user redirecting them sees them (no terminal)."""
    result = runner.invoke(app, ["demo", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_quick_demo_runs_every_stage_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    stdout, stderr = _demo_streams(out)
    output = stdout

    for recipe in ("demo-sft", "demo", "demo-heldout"):
        assert (out / "data" / recipe / "manifest.json").is_file()
    for stage in ("sft", "rl"):
        assert (out / stage / "final" / "model.safetensors").is_file()
    assert (out / "sft" / "plots" / "loss.png").is_file()
    assert (out / "rl" / "plots" / "reward.png").is_file()
    rl_steps = [json.loads(line)["step"] for line in _lines(out / "rl" / "metrics.jsonl")]
    assert rl_steps == [1, 2]
    for name in ("sft", "rl"):
        generations = out / "eval" / name / "generations.jsonl"
        assert len(_lines(generations)) == QUICK_HELDOUT
        run = json.loads((out / "eval" / name / "run.json").read_text())
        assert run["status"] == "complete"
        assert run["spec"]["model"]["name"] == str(out / name / "final")

    summary = DemoSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.quick
    assert summary.sft.rollouts == summary.rl.rollouts == QUICK_HELDOUT
    assert {t.phase for t in summary.timings} == {"data", "sft", "rl", "eval sft", "eval rl"}
    assert not any(t.skipped for t in summary.timings)
    assert all(Path(p).is_file() for p in summary.plots + summary.samples)
    for label in ("held-out accuracy", "tool-error ratio, correct rollouts", "format errors"):
        assert label in output
        assert label in (out / "summary.txt").read_text()
    # The summary is the result, on stdout; logs and progress are on stderr, each line whole.
    assert "held-out accuracy" not in stderr
    assert f"summary: {out / 'summary.json'} and {out / 'summary.txt'}" in stdout.splitlines()
    assert " INFO " not in stdout
    assert any(line.endswith(f"INFO saved {out / 'sft' / 'final'}") for line in stderr.splitlines())
    # Without a terminal, progress is a line per few steps with steps done, elapsed and ETA.
    progress = [line for line in stderr.splitlines() if " INFO sft demo-sft: " in line]
    assert [line.split(": ", 1)[1].split(" steps")[0] for line in progress][-1] == "6/6"
    assert ", elapsed 0:" in progress[-1]
    assert ", eta 0:00:00 | step 6  loss " in progress[-1]
    # samples.md shows each rollout under its problem and gold answer.
    heldout = {p.id: p for p in load_built(out / "data" / "demo-heldout")}
    samples = (out / "samples.md").read_text()
    sections = samples.split("\n## ")[1:]
    assert sections
    for section in sections:
        problem_id = section.split(" sample ")[0].split("/", 1)[1]
        assert f"- gold answer `{heldout[problem_id].answer}`;" in section
        assert f"**Problem**\n\n{heldout[problem_id].problem}\n" in section

    # Interrupted: the RL stage lost its final weights (its checkpoints remain) and the RL
    # evaluation half of its samples. Finished stages are skipped; the rest resumes.
    (out / "rl" / "final" / "trainer_state.json").unlink()
    generations = out / "eval" / "rl" / "generations.jsonl"
    generations.write_text("\n".join(_lines(generations)[: QUICK_HELDOUT // 2]) + "\n")
    output = _demo(out)
    again = DemoSummary.model_validate_json((out / "summary.json").read_text())
    skipped = {t.phase for t in again.timings if t.skipped}
    assert skipped == {"sft"}
    # The first run's timings, which trained SFT, are kept beside the re-run's.
    assert again.earlier_invocations == [summary.invocation()]
    assert "time, run 2 of 2" in (out / "summary.txt").read_text()
    assert "sft: finished earlier" in output
    assert "resuming demo-rl" in output
    assert len(_lines(generations)) == QUICK_HELDOUT
    assert [json.loads(line)["step"] for line in _lines(out / "rl" / "metrics.jsonl")] == [1, 2]
    assert again.sft == summary.sft


def test_demo_refuses_a_finished_run_with_other_options(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    final = out / "sft" / "final"
    final.mkdir(parents=True)
    (final / "trainer_state.json").write_text(
        json.dumps(
            {
                "stage": "demo-sft",
                "kind": "sft",
                "step": 1,
                "total_steps": 1,
                "data": {},
                "finished": True,
            }
        )
    )
    (out / "sft" / "config.yaml").write_text("name: something-else\n")
    result = runner.invoke(app, ["demo", "--quick", "--out", str(out), "--no-progress"])
    assert result.exit_code == 2
    assert "with another config" in result.output


def test_rl_steps_sets_every_rl_run_and_leaves_the_rest_of_the_config() -> None:
    paths = DemoPaths(Path("out"))
    default = rl_config(DemoOptions(out=paths.out), paths)
    assert default.rl is not None
    assert default.rl.steps == 60
    shorter = rl_config(DemoOptions(out=paths.out, rl_steps=30), paths, seed=2)
    assert shorter.rl is not None
    assert shorter.rl.steps == 30
    assert shorter.rl.model_copy(update={"steps": 60}) == default.rl
    with pytest.raises(ValueError, match="rl_steps"):
        DemoOptions(rl_steps=0)


def test_a_run_started_by_another_process_counts_as_the_same_config(tmp_path: Path) -> None:
    """The embedded sandbox's uid range is a per-process default: a demo re-run in a new
    process must still skip or resume its RL stage, and any real change must be refused."""
    options = DemoOptions(out=tmp_path)
    config = rl_config(options, DemoPaths(tmp_path))
    run_dir = RunDir(config.output_dir)
    run_dir.root.mkdir(parents=True)
    stored = yaml.safe_load(dump_config(config))
    stored["rl"]["sandbox"]["executor"]["uid_base"] += 1024
    run_dir.config.write_text(yaml.safe_dump(stored))
    assert _same_config(run_dir, config)
    stored["optimizer"]["lr"] = 1.0
    run_dir.config.write_text(yaml.safe_dump(stored))
    assert not _same_config(run_dir, config)
