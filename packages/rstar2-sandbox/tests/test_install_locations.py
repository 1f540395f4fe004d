"""The sandbox starts wherever its interpreter lives: a virtual environment under ``/tmp``,
``/var/tmp``, ``~/.cache`` (as ``uvx`` lays its tools out), ``$HOME`` or ``/opt``, and with
``TMPDIR`` inside the interpreter's tree; and a run sees of that tree only the interpreter.

Each case builds a small virtual environment in a clone-like directory there (``.venv`` beside a
file of the project), which imports this environment's packages through a ``.pth`` file, and starts
a ``LocalSandbox`` from it in a process of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = os.geteuid() == 0

# Run by the virtual environment's interpreter: start a sandbox, run a probe, print both as JSON.
STARTER = """
import asyncio, json, sys
from rstar2_sandbox import ExecutorSettings, LocalSandbox, RunRequest

PROBE = '''
import json, os, sys
def look(path):
    try:
        return sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
    except OSError as exc:
        return type(exc).__name__
open('/tmp/written-by-the-run', 'w').write('x')
print(json.dumps({"executable": sys.executable, "seen": {p: look(p) for p in %r}}))
'''

async def main():
    async with LocalSandbox(ExecutorSettings(servers=1, slots=2, preload=[])) as sandbox:
        result = await sandbox.run(RunRequest(code=PROBE % (sys.argv[1:],)))
        report = sandbox.isolation.model_dump()
    print(json.dumps({"result": result.model_dump(mode="json"), "isolation": report}))

asyncio.run(main())
"""


def make_clone(parent: Path) -> Path:
    """A directory like a clone of a project: a virtual environment ``.venv`` (importing this
    environment's packages) beside a file of the project's own."""
    clone = parent / "clone"
    clone.mkdir(parents=True)
    (clone / "PROJECT_SECRET.txt").write_text("a file of the project")
    venv = clone / ".venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    (inner,) = (venv / "lib").glob("python3*/site-packages")
    sites = [p for p in site.getsitepackages() if os.path.isdir(p)]
    lines = [f"import site; site.addsitedir({p!r})" for p in sites]
    (inner / "rstar2_test_env.pth").write_text("\n".join(lines) + "\n")
    return clone


def start_from(clone: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    """Start a sandbox with the clone's interpreter (from inside the clone, as a user would) and
    return what its probe run saw and the isolation report."""
    venv = clone / ".venv"
    seen = [str(venv), str(venv / "bin"), str(clone / "PROJECT_SECRET.txt"), str(clone), "/tmp"]
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", STARTER, *seen],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def check(clone: Path, started: dict[str, object]) -> None:
    result = started["result"]
    assert isinstance(result, dict)
    assert result["status"] == "success", result["stderr"]
    probe = json.loads(result["stdout"])
    venv = clone / ".venv"
    assert probe["executable"] == str(venv / "bin" / "python")
    isolation = started["isolation"]
    assert isinstance(isolation, dict)
    if not ROOT:
        return  # without root the runs keep the host's view: the start is what is checked
    for feature in ("filesystem_root", "run_tmp", "unprivileged_uid"):
        assert isolation[feature]["active"], (feature, isolation[feature])
    seen = probe["seen"]
    # Of the clone: the way to the interpreter, nothing else.
    assert seen[str(clone / "PROJECT_SECRET.txt")] == "FileNotFoundError"
    assert seen[str(clone)] == [".venv"]
    assert set(seen[str(venv)]) <= {"bin", "lib", "lib64", "pyvenv.cfg"}
    # The interpreter and the symlinks on the way to it (python -> python3.11 -> the base's).
    assert "python" in seen[str(venv / "bin")]
    assert all(name.startswith("python") for name in seen[str(venv / "bin")])
    # The run's own /tmp: its working directory and its file, and at most the way to the clone.
    tmp = set(seen["/tmp"]) - {"written-by-the-run"}
    assert len([name for name in tmp if name.startswith("run-")]) == 1
    way = {Path(clone).relative_to("/tmp").parts[0]} if clone.is_relative_to("/tmp") else set()
    assert {name for name in tmp if not name.startswith("run-")} == way


@pytest.fixture
def place(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory under the location the test names (removed afterwards)."""
    location = {
        "tmp": Path("/tmp"),
        "var-tmp": Path("/var/tmp"),
        "uv-tool-cache": Path.home() / ".cache" / "rstar2-test-uv" / "archive-v0",
        "home": Path.home(),
        "opt": Path("/opt"),
    }[request.param]
    try:
        location.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="rstar2-location-", dir=location))
    except OSError as exc:
        pytest.skip(f"cannot write under {location}: {exc}")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
    if request.param == "uv-tool-cache":
        shutil.rmtree(location.parent, ignore_errors=True)


@pytest.mark.parametrize("place", ["tmp", "var-tmp", "uv-tool-cache", "home", "opt"], indirect=True)
def test_the_sandbox_starts_from_a_virtual_environment_there(place: Path) -> None:
    clone = make_clone(place)
    check(clone, start_from(clone))


@pytest.mark.parametrize("place", ["tmp"], indirect=True)
def test_tmpdir_inside_the_interpreters_tree(place: Path) -> None:
    clone = make_clone(place)
    tmpdir = clone / ".venv" / "tmp"
    tmpdir.mkdir()
    check(clone, start_from(clone, {"TMPDIR": str(tmpdir)}))


def test_a_script_in_tmp_keeps_the_isolation(tmp_path: Path) -> None:
    """``python /tmp/script.py`` puts ``/tmp`` itself on ``sys.path``: the runs' ``/tmp`` is still
    their own (it was the host's, with no root of their own, before)."""
    directory = Path(tempfile.mkdtemp(prefix="rstar2-script-", dir="/tmp"))
    try:
        script = Path("/tmp") / f"rstar2-start-{uuid.uuid4().hex}.py"
        script.write_text(STARTER)
        try:
            done = subprocess.run(
                [sys.executable, str(script), str(directory)],
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            script.unlink()
        assert done.returncode == 0, done.stderr[-3000:]
        started = json.loads(done.stdout.splitlines()[-1])
        assert started["result"]["status"] == "success", started["result"]["stderr"]
        seen = json.loads(started["result"]["stdout"])["seen"]
        if ROOT:
            assert started["isolation"]["filesystem_root"]["active"], started["isolation"]
            assert seen[str(directory)] == "FileNotFoundError"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
