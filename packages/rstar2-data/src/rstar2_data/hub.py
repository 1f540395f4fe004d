"""Reaching the Hugging Face hub: one quick probe, then one clear line when it cannot be reached.

Left alone, ``datasets`` and ``huggingface_hub`` retry an unreachable hub for 20-30 s before
failing with a traceback. Here a single TCP probe of the hub decides first; when the hub cannot
be reached, the libraries are switched to offline mode, so a copy already in the local cache is
still used and a missing one fails at once with ``HubUnreachableError``, whose message says what
could not be reached and how to pass a local copy instead.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 3.0
"""How long the probe waits for a TCP connection to the hub."""


_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


class HubUnreachableError(ConnectionError):
    """A hub dataset or model could not be reached (no network, offline mode, or not cached)."""


def _offline_by_setting() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.upper() in {"1", "ON", "YES", "TRUE"}


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


@functools.cache
def hub_problem() -> str | None:
    """Why the hub cannot be reached (``None`` when it can), probed once per process.

    Offline mode set by the user (``HF_HUB_OFFLINE``) is reported as the reason without a probe.
    When the probe fails, offline mode is switched on for this process so that the libraries use
    their local cache instead of retrying.
    """
    if _offline_by_setting():
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return None  # the hub is reached through the proxy, which a direct probe cannot tell
    parts = urlsplit(_endpoint())
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        _go_offline()
        return f"{host}:{port}: {reason}"
    return None


def _go_offline() -> None:
    # Read at import by datasets and huggingface_hub: set the variable for modules not imported
    # yet and the constants of those that are.
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
    config = sys.modules.get("datasets.config")
    if config is not None:
        config.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]


def unreachable_message(what: str, problem: str, hint: str) -> str:
    """``could not reach WHAT on the Hugging Face hub (PROBLEM); HINT``."""
    return f"could not reach {what} on the Hugging Face hub ({problem}); {hint}"


def in_hub_cache(repo_id: str, filename: str) -> bool:
    """Whether the hub cache holds ``filename`` of model ``repo_id`` (usable with the hub
    offline)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return isinstance(try_to_load_from_cache(repo_id, filename), str)
    except HFValidationError:
        return False


def _snake_case(name: str) -> str:
    # datasets' own naming.camelcase_to_snakecase, which names its cache folders.
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


def dataset_in_cache(path: str) -> bool:
    """Whether ``datasets`` may hold hub dataset ``path`` in its cache: the folder it looks in
    when the hub cannot be reached (``HF_DATASETS_CACHE``, by default ``HF_HOME/datasets``,
    then ``namespace___name``) exists. Decided without importing ``datasets`` (2 s of CPU)."""
    cache = os.environ.get("HF_DATASETS_CACHE")
    if cache is None:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
        )
        cache = os.path.join(home, "datasets")
    *namespace, name = path.split("/")
    return (Path(cache).expanduser() / "___".join([*namespace, _snake_case(name)])).is_dir()


def check_hub_dataset(path: str, *, hint: str) -> None:
    """``HubUnreachableError`` ending with ``hint`` at once when the hub cannot be reached and
    ``datasets`` holds no copy of dataset ``path`` in its cache, before ``datasets`` loads."""
    problem = hub_problem()
    if problem is not None and not dataset_in_cache(path):
        raise HubUnreachableError(unreachable_message(f"dataset {path}", problem, hint))


def load_hub_dataset(path: str, *, config: str | None, split: str, hint: str) -> Any:
    """A hub dataset split (a ``datasets.Dataset``) through ``datasets``, from its cache when
    the hub cannot be reached; ``HubUnreachableError`` ending with ``hint`` when neither works."""
    check_hub_dataset(path, hint=hint)
    import datasets  # imported here: slow to import and only needed for hub datasets

    problem = hub_problem()
    try:
        return datasets.load_dataset(path, config, split=split)
    except ConnectionError as error:  # datasets' own "Couldn't reach ... on the Hub"
        raise HubUnreachableError(
            unreachable_message(f"dataset {path}", problem or str(error), hint)
        ) from None


def iter_hub_dataset(
    path: str, *, config: str | None, split: str, hint: str
) -> Iterator[dict[str, Any]]:
    """Rows of a hub dataset split (``load_hub_dataset``)."""
    yield from load_hub_dataset(path, config=config, split=split, hint=hint)
