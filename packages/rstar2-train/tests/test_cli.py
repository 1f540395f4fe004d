"""The command line: listing and showing configs, and one clear line for every bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_runs import DemoData
from typer.testing import CliRunner

from rstar2_data.terminal import cut_words
from rstar2_train.cli import app

runner = CliRunner()


def test_configs_lists_every_shipped_config() -> None:
    result = runner.invoke(app, ["configs"])
    assert result.exit_code == 0
    for name in ("tiny-sft", "tiny-rl", "qwen3-14b-sft", "qwen3-14b-rl-stage3"):
        assert name in result.output


def test_show_prints_the_resolved_config() -> None:
    result = runner.invoke(app, ["show", "qwen3-14b-rl-stage2", "--set", "rl.steps=3"])
    assert result.exit_code == 0
    shown = yaml.safe_load(result.output)
    assert shown["rl"]["steps"] == 3
    assert shown["rl"]["rollout"]["max_response_tokens"] == 12288  # from stage 2
    assert shown["rl"]["prompts_per_step"] == 512  # inherited from stage 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["show", "tiny-rl", "--set", "rl.roc.kep=3"], "did you mean 'keep'"),
        (["stage", "nope"], "neither a config file nor a shipped config"),
        (["stage", "tiny-rl", "--set", "model.path=/does/not/exist"], "/does/not/exist"),
        (["stage", "tiny-rl", "--resume", "--out", "/tmp/rstar2-no-run"], "nothing to resume"),
        (["show", "broken.yaml"], "broken.yaml: not valid YAML: line 3, column 1"),
        (["show", "tiny-rl", "--set", "rl.steps=[1"], "the value is not valid YAML: line 1"),
        (
            ["show", "tiny-sft", "--set", "model.path=x", "--set", "sft.max_steps=0"],
            "tiny-sft: invalid config: model: set exactly one of path, init (got path, "
            "init); sft.max_steps: Input should be greater than 0 (got 0)",
        ),
        (["stage", "tiny-rl", "--out", "a-file/run"], "a-file is not a directory"),
        (
            [
                "stage",
                "tiny-rl",
                "--set",
                "rl.max_staleness=1",
                "--set",
                "placement={mode: colocated, trainer: {ranks: 1}}",
            ],
            "rl.max_staleness > 0 overlaps rollouts with the update, but colocated engines",
        ),
        (["demo", "--ablation", "--ablation-async"], "separate runs: give one of them"),
        (["demo", "--out", "a-file/demo"], "a-file is not a directory"),
    ],
)
def test_bad_input_is_one_line_without_a_traceback(
    arguments: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "broken.yaml").write_text("extends: tiny-rl\nrl: [\n")
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, arguments)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert message in line


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (
            ["demo", "--rl-steps", "0"],
            "error: Invalid value for '--rl-steps': Input should be greater than or equal to 1 "
            "(see rstar2-train demo --help)",
        ),
        (["nosuch"], "error: No such command 'nosuch'. (see rstar2-train --help)"),
        (
            ["show", "tiny-rl", "--bogus"],
            "error: No such option: --bogus (see rstar2-train show --help)",
        ),
    ],
)
def test_option_validation_is_one_error_line_like_every_other_error(
    arguments: list[str], line: str
) -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, arguments, prog_name="rstar2-train")
    assert result.exit_code == 2
    assert result.output.splitlines() == [line]


def test_an_unreachable_hub_model_fails_before_the_data_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rstar2_data.hub import hub_problem

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_problem.cache_clear()  # probed once per process: forget what earlier tests found
    try:
        hub_model = ["model.path=org/no-such-model", "model.init=null", "tokenizer.train=null"]
        overrides = [part for setting in hub_model for part in ("--set", setting)]
        result = runner.invoke(
            app, ["stage", "tiny-sft", *overrides, "--out", str(tmp_path / "run")]
        )
    finally:
        hub_problem.cache_clear()
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert (
        "could not reach model.path 'org/no-such-model' on the Hugging Face hub "
        "(HF_HUB_OFFLINE is set); download it where the hub is reachable and set model.path "
        "to its folder"
    ) in " ".join(result.output.split())
    assert not (tmp_path / "run" / "data").exists()  # failed before building any data


# The command line as a user runs it, reporting at exit which heavy libraries it had loaded.
LOADED_AT_EXIT = """
import sys
from rstar2_train.cli import app
try:
    app(sys.argv[1:], prog_name="rstar2-train")
finally:
    print("loaded:", [name for name in ("torch", "transformers") if name in sys.modules])
"""


def test_an_unreachable_hub_endpoint_fails_before_the_trainer_loads(tmp_path: Path) -> None:
    """No network: the hub probe's refusal ends the command before torch and transformers are
    imported (about 12 s of a 2-core machine's CPU), naming the local copy and HF_HUB_OFFLINE."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)  # a proxy would make the probe trust the hub
    hub_model = ["model.path=org/no-such-model", "model.init=null", "tokenizer.train=null"]
    overrides = [part for setting in hub_model for part in ("--set", setting)]
    done = subprocess.run(
        [sys.executable, "-c", LOADED_AT_EXIT, "stage", "tiny-sft", *overrides],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines() == ["loaded: []"]
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "error: could not reach model.path 'org/no-such-model' on the Hugging Face hub "
        "(127.0.0.1:9: "
    )
    assert "set model.path to its folder" in line
    assert "HF_HUB_OFFLINE=1" in line
    assert not (tmp_path / "runs").exists()  # nothing written


def test_output_is_a_hidden_old_name_of_out(tmp_path: Path) -> None:
    old = runner.invoke(app, ["stage", "tiny-rl", "--resume", "--output", str(tmp_path / "run")])
    assert old.exit_code == 2
    assert f"nothing to resume: {tmp_path / 'run' / 'config.yaml'}" in " ".join(old.output.split())
    clash = runner.invoke(app, ["stage", "tiny-rl", "--out", "a", "--output", "b"])
    assert clash.exit_code == 2
    assert "give --out only" in clash.output
    assert "--output" not in runner.invoke(app, ["stage", "--help"]).output


def test_missing_data_is_reported(demo_data: DemoData, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "stage",
            "tiny-sft",
            "--out",
            str(tmp_path / "run"),
            "--set",
            "data.train.recipe=null",
            "--set",
            f"data.train.file={tmp_path / 'none.jsonl'}",
        ],
    )
    assert result.exit_code == 2
    assert "data file not found" in result.output


@pytest.mark.parametrize(
    "arguments",
    [["--help"], ["stage", "--help"], ["show", "--help"], ["demo", "--help"], ["configs"]],
)
def test_help_and_tables_fit_80_columns_without_cutting_a_word(arguments: list[str]) -> None:
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, arguments).output
    wide = CliRunner(env={"COLUMNS": "1000"}).invoke(app, arguments).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert not cut_words(narrow, wide)


def test_every_option_is_explained() -> None:
    result = runner.invoke(app, ["stage", "--help"])
    assert result.exit_code == 0
    for option in ("--set", "--out", "--resume", "--allow-changes", "--no-progress"):
        assert option in result.output


def test_library_errors_name_their_argument_and_the_command_line_its_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rstar2_scheduler import RolloutConfig
    from rstar2_train.config.loader import ConfigError, load_config
    from rstar2_train.config.schema import ValidationConfig
    from rstar2_train.demo import DemoOptions, run_async_ablation
    from rstar2_train.rl.validation import Validator

    with pytest.raises(ConfigError) as bad_set:
        load_config("tiny-rl", ["rl.steps"])
    assert str(bad_set.value).startswith("`overrides` 'rl.steps': expected KEY.PATH=VALUE")
    shown = runner.invoke(app, ["show", "tiny-rl", "--set", "rl.steps"])
    assert shown.output.startswith("error: --set 'rl.steps': expected KEY.PATH=VALUE")

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one core
    with pytest.raises(ValueError, match=r"^`ablation_async` puts the engine and the trainer"):
        run_async_ablation(DemoOptions(out=tmp_path / "api", ablation_async=True))
    demo = runner.invoke(app, ["demo", "--ablation-async", "--out", str(tmp_path / "cli")])
    assert demo.exit_code == 2
    assert " ".join(demo.output.split()).startswith("error: --ablation-async puts the engine")

    # rstar2-eval's errors name its own arguments; a stage names its config key instead.
    with pytest.raises(ValueError, match=r"^rl\.validation\.benchmarks: unknown benchmark 'x'"):
        Validator(
            ValidationConfig(benchmarks=["x"]),
            RolloutConfig(),
            seed=0,
            total_steps=1,
            out_dir=tmp_path,
        )
