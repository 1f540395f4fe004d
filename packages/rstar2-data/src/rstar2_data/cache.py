"""Content keys and checkpoint files of a build (``DIR/.cache``).

Every stage's files are named by a key that hashes all its output depends on: the rstar2-data
version and ``CACHE_FORMAT``, the recipe entries it runs, the SHA-256 of each local file it
reads (sources, benchmarks, graded samples), a hub dataset's fingerprint, and the keys of the
stages before it. A changed input gives new keys, so a stale file is never read; a build
removes the files of other keys when it finishes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

CACHE_FORMAT = 2
"""Raised when the layout or meaning of checkpoint files changes."""
_BLOCK = 1 << 20


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


def stage_key(*parts: Any) -> str:
    """A key over ``parts`` (JSON-ready), the package version and the cache format."""
    payload = json.dumps(
        [version("rstar2-data"), CACHE_FORMAT, *parts], sort_keys=True, default=str
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


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
