"""``model`` checked before torch and transformers load and before anything is downloaded: a
wrong path fails on the local disk alone, and a hub id that cannot be fetched (hub unreachable
and not cached, or no such model) in one request at most."""

from __future__ import annotations

import re
from pathlib import Path

from rstar2_data.hub import hub_problem, in_hub_cache, unreachable_message
from rstar2_eval.errors import InputError

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
"""A Hugging Face hub id: ``namespace/name``."""

LOCAL_COPY = (
    "download it where the hub is reachable and pass its folder instead (or into the hub "
    "cache: with HF_HUB_OFFLINE=1 the cache is used without trying the hub)"
)
"""What to do about a model or tokenizer the hub cannot give."""


def local_checkpoint(value: str) -> Path | None:
    """``model`` as a local checkpoint directory, checked without any network access; ``None``
    when it names a hub id instead."""
    path = Path(value).expanduser()
    if not path.exists() and HUB_ID.match(value):
        return None
    if not path.is_dir():
        raise InputError("model", f"{value}: no such checkpoint directory")
    if not (path / "config.json").is_file():
        raise InputError(
            "model", f"{value}: not a Hugging Face checkpoint directory (no config.json)"
        )
    return path.resolve()


def check_model(value: str) -> None:
    """``InputError`` naming ``model`` when ``value`` is neither a checkpoint directory nor a
    hub model whose ``config.json`` can be had (from the hub, or its cache when the hub cannot
    be reached). Other hub failures (gated, a server error) are left to the download."""
    if local_checkpoint(value) is not None:
        return
    problem = hub_problem()
    if problem is not None:
        if not in_hub_cache(value, "config.json"):
            raise InputError("model", unreachable_message(value, problem, LOCAL_COPY))
        return
    from huggingface_hub import file_exists

    try:
        found = file_exists(value, "config.json")
    except Exception:  # gated, a server error, a timeout: the download reports it
        return
    if not found:
        raise InputError("model", f"{value}: no such model on the Hugging Face hub")
