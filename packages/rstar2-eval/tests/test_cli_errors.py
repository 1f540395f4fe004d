"""Bad input to ``rstar2-eval score`` and ``run`` (more of ``run``'s options in
test_run_inputs.py): exit code 2, one line naming the file or option at fault, no traceback, and
an unreachable hub reported at once with how to pass a local copy."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rstar2_data.demo import demo_problems
from rstar2_eval import InputError
from rstar2_eval.cli import app

# Offline, as on a machine without the hub: the benchmark must fail at once, in one line.
runner = CliRunner(env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "80"})

GENERATION = {"benchmark": "aime24", "problem_id": "0", "sample_index": 0, "response": "x"}


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "good.jsonl").write_text(json.dumps(GENERATION) + "\n")
    (tmp_path / "broken.jsonl").write_text(json.dumps(GENERATION) + '\n{"benchmark": \n')
    (tmp_path / "no-index.jsonl").write_text(json.dumps({**GENERATION, "sample_index": "a"}))
    return tmp_path


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["score", "{tmp}/missing.jsonl"], "missing.jsonl"),
        (["score", "{tmp}/broken.jsonl"], "broken.jsonl, line 2"),
        (["score", "{tmp}/no-index.jsonl"], "no-index.jsonl, line 1"),
        (["score", "{tmp}/good.jsonl", "--out", "{tmp}/a-file/out"], "a-file is not a directory"),
        (["score", "{tmp}/good.jsonl", "--samples-out", "{tmp}"], "is a directory"),
        (["score", "{tmp}/good.jsonl", "--k", "0"], "'--k'"),
        (
            ["score", "{tmp}/good.jsonl"],
            "could not reach dataset HuggingFaceH4/aime_2024 on the Hugging Face hub "
            "(HF_HUB_OFFLINE is set); pass a folder holding a local copy (aime24.jsonl) with "
            "--data-dir",
        ),
        (
            ["run", "--model", "m", "--benchmarks", "aime24", "--out", "{tmp}/a-file/run"],
            "a-file is not a directory",
        ),
        (
            ["run", "--model", "{tmp}/no-such-dir", "--benchmarks", "aime24", "--out", "{tmp}/r"],
            "--model: {tmp}/no-such-dir: no such checkpoint directory",
        ),
        (
            ["run", "--model", "{tmp}", "--benchmarks", "aime24", "--out", "{tmp}/r"],
            "not a Hugging Face checkpoint directory (no config.json)",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    arguments: list[str], message: str, inputs: Path
) -> None:
    result = runner.invoke(app, [a.format(tmp=inputs) for a in arguments])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert message.format(tmp=inputs) in line


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (
            ["score", "{tmp}/missing.jsonl"],
            "error: Invalid value for 'generations': file '{tmp}/missing.jsonl' does not exist. "
            "(see rstar2-eval score --help)",
        ),
        (
            ["score", "{tmp}/good.jsonl", "--k", "0"],
            "error: Invalid value for '--k': Input should be greater than or equal to 1 "
            "(see rstar2-eval score --help)",
        ),
    ],
)
def test_option_validation_is_the_same_one_error_line(
    arguments: list[str], line: str, inputs: Path
) -> None:
    """click's own checks of options and arguments, not only the commands' checks."""
    wide = CliRunner(env={"COLUMNS": "1000"})
    result = wide.invoke(app, [a.format(tmp=inputs) for a in arguments], prog_name="rstar2-eval")
    assert result.exit_code == 2
    assert result.output.splitlines() == [line.format(tmp=inputs)]


@pytest.fixture
def unreachable_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No hub: its address is a closed local port; the process goes offline when the probe
    fails, which the test undoes."""
    from huggingface_hub import constants

    from rstar2_data.hub import hub_problem

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)
    hub_problem.cache_clear()
    yield
    hub_problem.cache_clear()


@pytest.fixture
def run_inputs(tmp_path: Path) -> dict[str, Any]:
    """``RunOptions`` fields that pass the checks made before a run loads its model: a
    checkpoint as far as the disk can tell, a local problem file."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    problems = tmp_path / "problems.jsonl"
    problems.write_text(demo_problems(1, seed=0)[0].model_dump_json() + "\n")
    return {"model": str(checkpoint), "benchmarks": [f"demo={problems}"], "out": tmp_path / "o"}


@pytest.mark.parametrize(
    ("argument", "value", "flag", "message"),
    [
        ("sandbox", "ftp://host", "--sandbox", "expected 'local' or an http(s) URL, got 'ftp"),
        ("benchmarks", "aime2024", "--benchmarks", "unknown benchmark 'aime2024'"),
        ("model", "{tmp}/no-such-dir", "--model", "{tmp}/no-such-dir: no such checkpoint"),
    ],
)
def test_the_api_names_its_argument_and_the_command_line_its_flag(
    argument: str, value: str, flag: str, message: str, run_inputs: dict[str, Any], tmp_path: Path
) -> None:
    from rstar2_eval import RunOptions, run_evaluation

    value, message = value.format(tmp=tmp_path), message.format(tmp=tmp_path)
    options = RunOptions.model_validate(
        {**run_inputs, argument: [value] if argument == "benchmarks" else value}
    )
    with pytest.raises(InputError) as raised:
        run_evaluation(options)
    assert raised.value.origin == argument
    assert str(raised.value).startswith(f"{argument}: {message}")
    assert "--" not in str(raised.value)

    given = {"model": run_inputs["model"], "benchmarks": run_inputs["benchmarks"][0]}
    command = [part for name, v in {**given, argument: value}.items() for part in (f"--{name}", v)]
    result = runner.invoke(app, ["run", *command, "--out", str(tmp_path / "cli"), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert f"error: {flag}: {message}" in " ".join(result.output.split())


# The command line as a user runs it, reporting at exit which heavy libraries it had loaded.
LOADED_AT_EXIT = """
import sys
from rstar2_eval.cli import app
try:
    app(sys.argv[1:], prog_name="rstar2-eval")
finally:
    print("loaded:", [m for m in ("torch", "transformers", "datasets") if m in sys.modules])
"""


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE=1", "closed port"])
def test_an_unreachable_hub_benchmark_fails_before_the_heavy_imports(
    offline: str, run_inputs: dict[str, Any], tmp_path: Path
) -> None:
    """Without the hub (or told to do without it) and without a cached copy, a hub benchmark
    is one line naming the local-copy option and HF_HUB_OFFLINE, before torch, transformers
    and datasets are imported (about 12 s of a 2-core machine's CPU)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)  # a proxy would make the probe trust the hub
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    if offline == "HF_HUB_OFFLINE=1":
        env["HF_HUB_OFFLINE"] = "1"
    arguments = ["run", "--model", run_inputs["model"], "--benchmarks", "aime24"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", LOADED_AT_EXIT, *arguments, "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines() == ["loaded: []"]
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: aime24: could not reach dataset HuggingFaceH4/aime_2024")
    assert "pass a folder holding a local copy (aime24.jsonl) with --data-dir" in line
    assert "HF_HUB_OFFLINE=1" in line
    # CPU, not wall time: the same on a loaded machine (0.9 s here; 12 s before the check).
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 2.0


def test_a_cached_hub_benchmark_passes_the_early_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unreachable_hub: None
) -> None:
    """The early check lets ``datasets`` decide where it holds a copy in its cache."""
    from rstar2_eval.loading import check_hub
    from rstar2_eval.registry import get_benchmark

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    spec = get_benchmark("math500")
    with pytest.raises(InputError) as raised:
        check_hub(spec)
    # The Python API names its own argument; the command line said --data-dir.
    assert "with `data_dir`" in str(raised.value)
    assert "--data-dir" not in str(raised.value)
    (tmp_path / "datasets" / "HuggingFaceH4___math-500" / "default" / "0.0.0" / "abc").mkdir(
        parents=True
    )
    check_hub(spec)
