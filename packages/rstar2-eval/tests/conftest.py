"""Shared fixtures: the benchmark files and one warm grader for the whole session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rstar2_eval import Grader, GraderConfig

# Helper modules next to the tests (e.g. a verifier that hangs) must be importable by name in
# grading worker processes, which take the caller's sys.path.
sys.path.insert(0, str(Path(__file__).parent / "helpers"))
# The benchmark's stub server doubles as a test server.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

_DEFAULT_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "benchmarks"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The local benchmark copies (override with RSTAR2_BENCHMARK_DIR)."""
    path = Path(os.environ.get("RSTAR2_BENCHMARK_DIR", _DEFAULT_DATA))
    if not (path / "aime24.jsonl").is_file():
        pytest.skip(f"benchmark files not found under {path}")
    return path


@pytest.fixture(scope="session")
def grader() -> Iterator[Grader]:
    """Two warm workers shared by the tests (worker start-up is the slow part).

    The answer-length guard is raised so that hostile long answers reach the workers.
    """
    with Grader(GraderConfig(workers=2, timeout_s=3.0, max_answer_chars=200_000)) as shared:
        shared.warm_up()
        yield shared


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint overfitted on two demo transcripts (see helpers/tiny_checkpoint.py)."""
    from tiny_checkpoint import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("checkpoint"))


@pytest.fixture(scope="session")
def demo_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint's two training problems as an rstar2-data build directory."""
    from tiny_checkpoint import build_demo_set

    return build_demo_set(tmp_path_factory.mktemp("demo-set"))


@pytest.fixture(scope="session")
def transformers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``transformers serve`` process for the session; it serves whichever local checkpoint
    a request names (see helpers/servers.py). Skipped where transformers[serving] is missing."""
    from servers import transformers_serve

    with transformers_serve(tmp_path_factory.mktemp("transformers-serve") / "serve.log") as url:
        yield url
