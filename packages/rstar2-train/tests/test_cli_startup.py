"""Every rstar2 command line answers ``--help`` without importing the heavy libraries (torch,
transformers, ray, datasets): they load only once a command runs, which keeps ``--help`` and
argument errors well under a second and a half. Checked here, where all five tools are installed
(rstar2-train depends on the other packages), in a fresh interpreter per tool."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
