"""``rstar2-eval run`` end to end on CPU: a tiny checkpoint that really uses the tool, a shared
benchmark slice and the synthetic demo task, all outputs, re-scoring, resume after SIGKILL, and an
OpenAI-compatible server process (``transformers serve``) giving the same greedy answers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rstar2_data import load_built
from rstar2_eval.cli import app

pytestmark = pytest.mark.slow

SETTINGS = [
    *("--limit", "2", "--samples", "2", "--temperature", "0"),
    *("--max-tokens", "400", "--max-turns", "4", "--batch-size", "4"),
]
CONSOLE_SCRIPT = Path(sys.executable).parent / "rstar2-eval"

Key = tuple[str, str, int]


def run_args(source: list[str], demo_set: Path, data_dir: Path, out: Path) -> list[str]:
    return [
        "run",
        *source,
        *("--benchmarks", f"aime24,demo={demo_set}", "--data-dir", str(data_dir)),
        *SETTINGS,
        *("--out", str(out), "--no-progress"),
    ]


def generations(out: Path) -> dict[Key, dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    keyed = {(r["benchmark"], r["problem_id"], r["sample_index"]): r for r in rows}
    assert len(keyed) == len(rows), "a sample appears twice"
    return keyed


@pytest.fixture(scope="module")
def reference(
    checkpoint: Path, demo_set: Path, data_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """One uninterrupted in-process run; the other runs must match it sample by sample."""
    out = tmp_path_factory.mktemp("reference")
    args = run_args(["--model", str(checkpoint)], demo_set, data_dir, out)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_run_writes_every_output(reference: Path, checkpoint: Path, demo_set: Path) -> None:
    names = {p.name for p in reference.iterdir()}
    assert {
        "generations.jsonl",
        "generations.report.json",
        "generations.problems.csv",
        "generations.scores.png",
        "run.json",
    } <= names
    samples = generations(reference)
    assert len(samples) == 2 * 2 * 2  # two sets, two problems each (--limit), two samples

    # The demo problems are solved with the tool, exactly as the checkpoint was trained.
    golds = {p.id: p.answer for p in load_built(demo_set)}
    demo = {key: row for key, row in samples.items() if key[0] == "demo"}
    assert {key[1] for key in demo} == set(golds)
    for (_, problem_id, _), row in demo.items():
        gold = golds[problem_id]
        assert f"<tool_response>\n{gold}\n" in row["response"]  # the sandbox ran the call
        assert row["response"].endswith(f"\\boxed{{{gold}}}\n</answer><|im_end|>")
        assert (row["tool_calls"], row["tool_errors"], row["truncated"]) == (1, 0, False)

    report = json.loads((reference / "generations.report.json").read_text())
    scores = {b["benchmark"]: b for b in report["benchmarks"]}
    assert scores["demo"]["avg"] == 1.0
    assert scores["demo"]["maj_at_k"] == {"1": 1.0, "2": 1.0}
    assert scores["demo"]["tool_calls_per_response"] == 1.0
    assert scores["demo"]["tool_error_ratio"] == 0.0
    assert (scores["aime24"]["problems"], scores["aime24"]["samples"]) == (2, 4)
    assert scores["aime24"]["mean_response_tokens"] is not None

    record = json.loads((reference / "run.json").read_text())
    assert record["status"] == "complete"
    assert record["rollouts"] == {"planned": 8, "resumed": 0, "generated": 8, "failed": 0}
    spec = record["spec"]
    assert (
        spec["settings"] | {"samples": 2, "temperature": 0.0, "max_tokens": 400} == spec["settings"]
    )
    weights = checkpoint / "model.safetensors"
    assert spec["model"]["weights_bytes"] == weights.stat().st_size
    assert len(spec["model"]["weights_sha256"]) == 64
    # The checkpoint ships rstar2's template, so "its own" renders as rstar2's.
    assert spec["chat_template"] == "checkpoint"
    assert record["execution"]["engine"] == "transformers"
    assert {"rstar2-eval", "rstar2-scheduler", "torch", "transformers"} <= set(record["versions"])
    assert [s["source"]["kind"] for s in spec["problem_sets"]] == ["registry", "build"]


def test_score_reproduces_the_run_report(reference: Path, tmp_path: Path) -> None:
    # run.json beside the generations names the demo set's build directory and the --limit.
    result = CliRunner().invoke(
        app, ["score", str(reference / "generations.jsonl"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    rescored = json.loads((tmp_path / "generations.report.json").read_text())
    assert rescored == json.loads((reference / "generations.report.json").read_text())


def test_score_finds_relative_inputs_from_another_folder(
    checkpoint: Path, demo_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a user runs it: relative paths from the folder the run started in...
    started = tmp_path / "project"
    shutil.copytree(demo_set, started / "data" / "demo")
    monkeypatch.chdir(started)
    args = ["run", "--model", str(checkpoint), "--benchmarks", "demo=data/demo"]
    args += [*SETTINGS, "--limit", "1", "--out", "evals/demo", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # Results on stdout (the table, where they were written); logs on stderr, one line each.
    assert "rstar2-eval run: " in result.stdout
    assert "rstar2-eval run: " not in result.stderr
    assert "wrote evals/demo" in result.stdout.splitlines()
    assert " INFO " not in result.stdout
    assert any(
        " INFO evaluating " in line and line.endswith("the checkpoint's chat template")
        for line in result.stderr.splitlines()
    ), result.stderr
    recorded = json.loads(Path("evals/demo/run.json").read_text())
    assert recorded["spec"]["problem_sets"][0]["source"]["path"] == str(started / "data" / "demo")
    # ...and scored, or resumed, from anywhere else.
    monkeypatch.chdir(tmp_path)
    scored = CliRunner().invoke(app, ["score", "project/evals/demo/generations.jsonl"])
    assert scored.exit_code == 0, scored.output
    assert "demo" in scored.stdout
    resumed = CliRunner().invoke(app, ["run", "--out", "project/evals/demo", "--resume"])
    assert resumed.exit_code == 0, resumed.output


def test_run_again_resumes_without_generating(reference: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    before = (copy / "generations.jsonl").read_bytes()
    result = CliRunner().invoke(app, ["run", "--out", str(copy), "--resume", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert (copy / "generations.jsonl").read_bytes() == before
    record = json.loads((copy / "run.json").read_text())
    assert record["rollouts"] == {"planned": 8, "resumed": 8, "generated": 0, "failed": 0}


def test_other_settings_in_the_same_directory_are_refused(reference: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    result = CliRunner().invoke(
        app, ["run", "--out", str(copy), "--resume", "--temperature", "0.7", "--no-progress"]
    )
    assert result.exit_code == 2
    assert "settings.temperature: 0.0 -> 0.7" in result.output
    assert "Traceback" not in result.output


def test_resume_after_sigkill_loses_and_duplicates_nothing(
    reference: Path, checkpoint: Path, demo_set: Path, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    args = run_args(["--model", str(checkpoint)], demo_set, data_dir, out)
    args[args.index("--samples") + 1] = "4"
    args[args.index("--batch-size") + 1] = "1"  # slow enough to be killed mid-run
    job = subprocess.Popen(
        [str(CONSOLE_SCRIPT), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    lines = out / "generations.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not (lines.exists() and lines.read_bytes().count(b"\n") >= 3):
            assert job.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run wrote no generations"
            time.sleep(0.05)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the whole job: sandbox and grading workers too
        job.wait()
    done = lines.read_bytes().count(b"\n")
    assert 3 <= done < 16
    with lines.open("ab") as torn:  # a write cut short by the kill
        torn.write(b'{"benchmark": "demo", "problem_id": "demo-')

    result = CliRunner().invoke(app, ["run", "--out", str(out), "--resume", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "dropping an incomplete last line" in " ".join(result.output.split())
    samples = generations(out)
    expected = {(name, pid, i) for (name, pid, _) in generations(reference) for i in range(4)}
    assert set(samples) == expected
    record = json.loads((out / "run.json").read_text())
    assert record["rollouts"] == {
        "planned": 16,
        "resumed": done,
        "generated": 16 - done,
        "failed": 0,
    }
    # Greedy decoding: every sample equals the uninterrupted run's sample of its problem.
    first = generations(reference)
    for (name, problem_id, _), row in samples.items():
        assert row["response"] == first[(name, problem_id, 0)]["response"]


def test_endpoint_gives_the_same_answers_as_in_process(
    reference: Path,
    checkpoint: Path,
    demo_set: Path,
    data_dir: Path,
    tmp_path: Path,
    transformers_server: str,
) -> None:
    """The trained checkpoint behind ``transformers serve``: its tool calls survive the text
    round trip, and the token counts are the server's (exactly the in-process engine's)."""
    out = tmp_path / "endpoint"
    source = [
        *("--endpoint", transformers_server),
        *("--served-model", str(checkpoint), "--tokenizer", str(checkpoint)),
    ]
    args = run_args(source, demo_set, data_dir, out)
    args[args.index("--samples") + 1] = "1"  # greedy: one sample per problem says it all
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    remote = generations(out)
    local = generations(reference)
    assert len(remote) == 4
    for key, row in remote.items():
        assert row["response"] == local[key]["response"], key
        # The server's own token count, not the re-encoded text's.
        assert row["response_tokens"] == local[key]["response_tokens"], key
    assert any(row["tool_calls"] for row in remote.values())  # the calls reached the sandbox
    record = json.loads((out / "run.json").read_text())
    assert record["spec"]["model"] == {
        "kind": "endpoint",
        "name": str(checkpoint),
        "revision": None,
        "weights_sha256": None,
        "weights_bytes": None,
    }
