"""Every rstar2 command line answers ``--help`` without importing the heavy libraries (torch,
transformers, ray, datasets): they load only once a command runs, which keeps ``--help`` and
argument errors well under a second and a half. Checked here, where all five tools are installed
(rstar2-train depends on the other packages), in a fresh interpreter per tool. So do
``rstar2-train show`` and every bad config (unknown name, bad value, YAML error, malformed
``--set``), and ``rstar2-eval run`` with a missing benchmark file or an unreachable sandbox: they
are answered before the trainer or the model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_data.demo import demo_problems

HEAVY = ["torch", "transformers", "ray", "datasets", "vllm", "math_verify"]

COMMANDS = {
    "rstar2_sandbox": ["serve", "worker", "bench"],
    "rstar2_data": ["build", "stats", "recipes"],
    "rstar2_scheduler": ["bench", "plot", "sweep"],
    "rstar2_eval": ["run", "score", "benchmarks"],
    "rstar2_train": ["stage", "configs", "show", "demo"],
}

# The tool's app answers --help for itself and each command, in one interpreter; what it loaded
# is printed last as JSON.
PROBE = """
import json, sys
from {package}.cli import app
from typer.main import get_command

command = get_command(app)
for arguments in [[], *[[name] for name in {commands!r}]]:
    try:
        command.main([*arguments, "--help"], prog_name="probe", standalone_mode=False)
    except SystemExit:
        pass
print(json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)))
"""


@pytest.mark.parametrize("package", sorted(COMMANDS))
def test_help_imports_no_heavy_library(package: str) -> None:
    probe = PROBE.format(package=package, commands=COMMANDS[package], heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    *helps, loaded = result.stdout.strip().splitlines()
    assert sum("Usage:" in line for line in helps) == 1 + len(COMMANDS[package])
    assert json.loads(loaded) == []


# Each command line runs in the probe's interpreter; its exit code is printed after a marker,
# then what it loaded.
BAD_INPUT_PROBE = """
import json, sys
from {package}.cli import app
from typer.main import get_command

command = get_command(app)
for arguments in {runs!r}:
    try:
        # Without standalone mode, click returns the code of an Exit and raises the rest.
        returned = command.main(arguments, prog_name="probe", standalone_mode=False)
        code = returned if isinstance(returned, int) else 0
    except SystemExit as exit:
        code = exit.code
    except Exception as error:
        code = getattr(error, "exit_code", repr(error))
    print("@@", json.dumps(code))
print("@@", json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)))
"""

BAD_INPUTS = {
    "rstar2_train": [
        (["stage", "no-such-stage"], 2, "is neither a config file nor a shipped config"),
        (["stage", "tiny-rl", "--set", "rl.steps=abc"], 2, "rl.steps: Input should be a valid"),
        (["stage", "broken.yaml"], 2, "broken.yaml: not valid YAML: line 3"),
        (["stage", "tiny-rl", "--set", "rl.steps"], 2, "--set 'rl.steps': expected KEY.PATH"),
        (
            ["stage", "tiny-sft", "--set", "rl.steps=3"],
            2,
            "tiny-sft: rl.steps: not settings of an SFT",
        ),
        (["show", "tiny-rl"], 0, "name: tiny-rl"),
    ],
    "rstar2_eval": [
        (
            ["run", "--model", "model", "--benchmarks", "aime24", "--data-dir", "empty"],
            2,
            "empty/aime24.jsonl: no local copy of aime24",
        ),
        (
            [
                "run",
                "--model",
                "model",
                "--benchmarks",
                "demo=problems.jsonl",  # local: a registry benchmark would be checked on the hub
                "--sandbox",
                "http://127.0.0.1:9",
            ],
            2,
            "--sandbox: http://127.0.0.1:9 is not reachable",
        ),
    ],
}


@pytest.mark.parametrize("package", sorted(BAD_INPUTS))
def test_bad_input_is_answered_before_the_heavy_imports(package: str, tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("extends: tiny-rl\nrl: [\n")
    (tmp_path / "empty").mkdir()
    model = tmp_path / "model"  # a checkpoint as far as the command's first check can tell
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    (tmp_path / "problems.jsonl").write_text(demo_problems(1, seed=0)[0].model_dump_json() + "\n")
    runs = [
        [*arguments, "--out", str(tmp_path / "out")] if package == "rstar2_eval" else arguments
        for arguments, _, _ in BAD_INPUTS[package]
    ]
    probe = BAD_INPUT_PROBE.format(package=package, runs=runs, heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "1000"},
    )
    marked = [line[3:] for line in result.stdout.splitlines() if line.startswith("@@ ")]
    *codes, loaded = marked
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    for (arguments, code, message), got in zip(BAD_INPUTS[package], codes, strict=True):
        assert json.loads(got) == code, (arguments, result.stderr)
        shown = result.stdout if code == 0 else "\n".join(errors)
        assert message in shown, (arguments, shown)
    assert json.loads(loaded) == []
