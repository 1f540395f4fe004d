"""What ``rstar2-eval run`` checks before it loads torch, transformers and the model, in the order
``run_evaluation`` meets them: the model can be had (``check_model``), the local problem files
can be read and hub benchmarks can be had, and a sandbox URL answers; so such a mistake is
reported in about a second rather than once the model has loaded. (Benchmarks are downloaded
later, once the options are validated.)"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from rstar2_eval.checkpoints import check_model
from rstar2_eval.errors import InputError
from rstar2_eval.loading import check_hub
from rstar2_eval.problem_sets import load_source, parse_sources
from rstar2_eval.registry import get_benchmark

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=15)
"""How long a service (sandbox, endpoint) may take to answer a probe."""


async def probe_sandbox(spec: str) -> str | None:
    """``local`` (started with the run): None. Else the URL of an rstar2-sandbox service whose
    ``/healthz`` answered; InputError naming ``sandbox`` when it did not."""
    if spec == "local":
        return None
    parts = urlsplit(spec)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError("sandbox", f"expected 'local' or an http(s) URL, got {spec!r}")
    url = spec.rstrip("/")
    try:
        async with (
            aiohttp.ClientSession(timeout=PROBE_TIMEOUT) as session,
            session.get(url + "/healthz") as response,
        ):
            if response.status != 200:
                raise InputError("sandbox", f"{url}/healthz answered HTTP {response.status}")
    except (aiohttp.ClientError, TimeoutError) as error:
        raise InputError(
            "sandbox", f"{url} is not reachable: {type(error).__name__}: {error}"
        ) from None
    return url


def check_inputs(
    model: str | None, benchmarks: str | Sequence[str], data_dir: Path | None, sandbox: str
) -> None:
    """InputError, first for the model (``check_model``), then for the first problem set that
    cannot be read from a local file (build directories, JSON Lines files, registry benchmarks
    with ``data_dir`` or shipped by a package) or had from the hub, then for a sandbox URL
    that does not answer."""
    if model is not None:
        check_model(model)
    for source in parse_sources(benchmarks):
        local = source.kind != "registry" or get_benchmark(source.name).hub is None
        if local or data_dir is not None:
            load_source(source, data_dir)
        else:
            check_hub(get_benchmark(source.name))
    asyncio.run(probe_sandbox(sandbox))
