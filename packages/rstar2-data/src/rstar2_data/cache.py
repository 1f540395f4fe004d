"""Content keys and checkpoint files of a build (``DIR/.cache``).

Every stage's files are named by a key that hashes all its output depends on: the code that
makes it (``code_digest``: rstar2-data's own source files, and the versions of the libraries
that parse and write rows), the recipe entries it runs, the SHA-256 of each local file it
reads (sources, benchmarks, graded samples), a hub dataset's fingerprint, and the keys of the
stages before it. A changed input or a changed line of code gives new keys, so a stale file is
never read; a build removes the files of other keys when it finishes. Each stage also records
the SHA-256 of the files it wrote and checks them before reusing them (``sources.py``,
``filter_stage.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rstar2_data.jsonl import remove_temporaries

logger = logging.getLogger(__name__)

CACHE_DIR = ".cache"
SHUFFLE_PREFIX = "shuffle-"
PARALLEL_PREFIX = "hf-"
"""Folders of ``CACHE_DIR`` that hold one run's scratch files (the shuffle's buckets, the
parallel checks' ``datasets`` cache), never read by a later build."""
_BLOCK = 1 << 20
# Libraries whose behaviour is part of a stage's output: row validation and dumps (pydantic),
# Parquet reading (pyarrow), hub datasets (datasets).
_LIBRARIES = ("pydantic", "pyarrow", "datasets")


@dataclass(frozen=True)
class FileDigest:
    """A file's SHA-256 and its number of lines (the last one counted without its newline)."""

    sha256: str
    lines: int


def file_digest(path: Path) -> FileDigest:
    """SHA-256 and line count of ``path``, read in 1 MB blocks."""
    sha = hashlib.sha256()
    lines = 0
    last = b"\n"
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            sha.update(block)
            lines += block.count(b"\n")
            last = block[-1:]
    return FileDigest(sha.hexdigest(), lines + (last != b"\n"))


@cache
def code_digest() -> str:
    """SHA-256 over the code a build runs: every ``.py`` file of this package (relative path
    and bytes) and the versions of ``_LIBRARIES``.

    The package's version alone does not change when its code does (an editable install, a
    patched copy), and a filter that behaves differently must not reuse the rows the old one
    kept. Any edit of the package's code invalidates every stage: coarser than needed, never
    stale. Computed once per process (about 40 small files).
    """
    root = Path(__file__).resolve().parent
    sha = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        sha.update(f"{path.relative_to(root).as_posix()}\0".encode())
        sha.update(hashlib.sha256(path.read_bytes()).digest())
    for library in _LIBRARIES:
        sha.update(f"{library}=={version(library)}\0".encode())
    return sha.hexdigest()


def stage_key(*parts: Any) -> str:
    """A key over ``parts`` (JSON-ready) and the code that makes the stage (``code_digest``)."""
    payload = json.dumps([code_digest(), *parts], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def remove_leftovers(out_dir: Path) -> None:
    """Remove what a build killed mid-write left in ``out_dir`` and its cache: temporary files
    (``atomic_output``'s) and scratch folders. Only under the folder's lock."""
    cache_dir = out_dir / CACHE_DIR
    removed = [*remove_temporaries(out_dir), *remove_temporaries(cache_dir)]
    if cache_dir.is_dir():
        for path in cache_dir.iterdir():
            if path.is_dir() and path.name.startswith((SHUFFLE_PREFIX, PARALLEL_PREFIX)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    if removed:
        logger.info(
            "removed %d files and folders an interrupted build left: %s",
            len(removed),
            ", ".join(str(path.relative_to(out_dir)) for path in removed),
        )


def prune(cache_dir: Path, keep: set[str]) -> None:
    """Remove the entries of ``cache_dir`` whose name holds none of the keys in ``keep``."""
    if not cache_dir.is_dir():
        return
    for path in cache_dir.iterdir():
        if any(key in path.name for key in keep):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
