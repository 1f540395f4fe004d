"""``--model`` checked on the local disk alone, so a wrong path fails before torch, transformers
or the network are touched."""

from __future__ import annotations

import re
from pathlib import Path

from rstar2_eval.errors import InputError

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
"""A Hugging Face hub id: ``namespace/name``."""


def local_checkpoint(value: str) -> Path | None:
    """``--model`` as a local checkpoint directory, checked without any network access; ``None``
    when it names a hub id instead."""
    path = Path(value).expanduser()
    if not path.exists() and HUB_ID.match(value):
        return None
    if not path.is_dir():
        raise InputError("--model", f"{value}: no such checkpoint directory")
    if not (path / "config.json").is_file():
        raise InputError(
            "--model", f"{value}: not a Hugging Face checkpoint directory (no config.json)"
        )
    return path.resolve()
