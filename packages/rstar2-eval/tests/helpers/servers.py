"""Server processes for endpoint tests: the benchmark's stub and a real ``transformers serve``."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SERVING_MODULES = ("fastapi", "uvicorn", "openai")


@contextlib.contextmanager
def stub_server(tokenizer: Path, *options: str) -> Iterator[str]:
    """``bench/stub_server.py`` (canned tool-calling turns, vLLM's token-id dialect; ``options``
    such as ``--script FILE`` go to its command line); yields its root URL. Every sample it
    gives a problem is the same."""
    server = subprocess.Popen(
        [sys.executable, str(BENCH / "stub_server.py"), "--tokenizer", str(tokenizer), *options],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[-1])
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def transformers_serve(log: Path, *, timeout_s: float = 240) -> Iterator[str]:
    """A ``transformers serve`` process on loopback, CPU only, offline; yields its root URL.

    No model is named at start: it loads the local checkpoint each request names in ``model``
    (``--served-model DIR``). Skips the test, saying why, where the ``serving`` extra of
    transformers is not installed.
    """
    missing = [name for name in SERVING_MODULES if importlib.util.find_spec(name) is None]
    command = Path(sys.executable).parent / "transformers"
    if missing or not command.exists():
        pytest.skip(
            f"transformers serve is not installed here (missing: {', '.join(missing) or command});"
            " install transformers[serving] (rstar2-eval's test extra)"
        )
    port = _free_port()
    with log.open("wb") as output:
        server = subprocess.Popen(
            [str(command), "serve", "--port", str(port), "--device", "cpu"],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert server.poll() is None, f"transformers serve exited: {log.read_text()}"
                assert time.monotonic() < deadline, "transformers serve did not start"
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
