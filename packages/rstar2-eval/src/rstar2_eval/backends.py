"""What ``rstar2-eval run`` evaluates with: checkpoints, endpoints, tokenizers, sandboxes.

Every failure to reach or load one of them is an ``InputError`` naming the argument at fault
(a ``RunOptions`` field: ``model``, ``endpoints``, ``sandbox``, ...).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from transformers import PreTrainedTokenizerBase

from rstar2_data.hub import hub_problem, unreachable_message
from rstar2_eval.checkpoints import LOCAL_COPY, local_checkpoint
from rstar2_eval.errors import InputError
from rstar2_eval.preflight import PROBE_TIMEOUT, probe_sandbox
from rstar2_eval.settings import EvalSettings
from rstar2_sandbox.protocol import Sandbox
from rstar2_scheduler import ChatConfig, Engine, SchedulerConfig
from rstar2_scheduler.engines import EndpointError
from rstar2_scheduler.protocol import ChatProtocol, Conversation

logger = logging.getLogger(__name__)

EngineKind = Literal["auto", "vllm", "transformers"]
TemplateChoice = Literal["auto", "checkpoint", "rstar2"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def resolve_checkpoint(value: str) -> Path:
    """A local checkpoint directory for ``model``: the directory itself, or a hub id fetched
    into the Hugging Face cache (needs network access, or the model in that cache)."""
    local = local_checkpoint(value)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download

    problem = hub_problem()
    try:
        return Path(snapshot_download(value))
    except Exception as error:  # offline, unknown repo, gated: all mean the same to the user
        if problem is not None:
            raise InputError("model", unreachable_message(value, problem, LOCAL_COPY)) from None
        raise InputError(
            "model",
            f"{value} is not a local directory and could not be fetched from the hub: "
            f"{type(error).__name__}: {error}",
        ) from None


def weights_digest(checkpoint: Path) -> tuple[str, int]:
    """SHA-256 over the checkpoint's weight files (names and contents), and their total size."""
    files = sorted(
        p for p in checkpoint.rglob("*") if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)
    )
    if not files:
        raise InputError("model", f"{checkpoint}: no weight files ({', '.join(_WEIGHT_SUFFIXES)})")
    digest = hashlib.sha256()
    size = 0
    for path in files:
        with path.open("rb") as handle:
            file_hash = hashlib.file_digest(handle, "sha256").hexdigest()
        digest.update(f"{path.relative_to(checkpoint)}\0{file_hash}\n".encode())
        size += path.stat().st_size
    return digest.hexdigest(), size


def load_tokenizer(source: str, argument: str) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(source)``, the way vLLM and other servers load it; an
    ``InputError`` naming ``argument`` (where ``source`` came from) when it cannot."""
    from transformers import AutoTokenizer

    problem = None if Path(source).expanduser().exists() else hub_problem()
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(source)
    except Exception as error:
        if problem is not None:
            message = unreachable_message(source, problem, LOCAL_COPY)
            raise InputError(argument, message) from None
        reason = " ".join(str(error).split())
        raise InputError(argument, f"cannot load a tokenizer from {source}: {reason}") from None
    return tokenizer


def chat_config(
    tokenizer: PreTrainedTokenizerBase, choice: TemplateChoice, *, reason_prefill: str | None
) -> ChatConfig:
    """The checkpoint's own template when it ships one (``auto``), or the one asked for."""
    ships = bool(getattr(tokenizer, "chat_template", None))
    if choice == "checkpoint" and not ships:
        raise InputError("chat_template", "the checkpoint's tokenizer ships no chat template")
    use_own = choice == "checkpoint" or (choice == "auto" and ships)
    overrides: dict[str, Any] = {"use_checkpoint_template": use_own}
    if reason_prefill is not None:
        overrides["reason_prefill"] = reason_prefill
    return ChatConfig(**overrides)


def longest_request(
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatConfig,
    settings: EvalSettings,
    problems: Iterable[str],
) -> int:
    """The largest prompt + response budget of the problems: the longest request an engine
    must hold."""
    protocol = ChatProtocol(tokenizer, chat, tools=settings.tools())
    longest = max(
        len(Conversation(protocol, protocol.initial_messages(problem)).prompt_ids)
        for problem in problems
    )
    return longest + settings.max_tokens


def vllm_available() -> bool:
    """vLLM is installed and a CUDA device is visible."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def choose_engine(kind: EngineKind) -> Literal["vllm", "transformers"]:
    if kind == "auto":
        return "vllm" if vllm_available() else "transformers"
    if kind == "vllm" and importlib.util.find_spec("vllm") is None:
        raise InputError("engine", 'vllm is not installed: pip install "rstar2-scheduler[vllm]"')
    return kind


def vllm_engine(
    checkpoint: Path, *, max_model_len: int, seed: int, engine_args: dict[str, Any]
) -> Engine:
    """A ``VLLMEngine`` on the checkpoint; ``engine_args`` override the defaults here."""
    from rstar2_scheduler import VLLMEngine, VLLMEngineConfig

    arguments = {
        "max_model_len": max_model_len,
        "seed": seed,
        "enable_prefix_caching": True,
        **engine_args,
    }
    return VLLMEngine(VLLMEngineConfig(model=str(checkpoint), engine_args=arguments))


def transformers_engine(
    checkpoint: Path,
    *,
    longest_request: int,
    batch_size: int,
    kv_budget: int | None,
    device: str,
    dtype: str,
    seed: int,
) -> Engine:
    """A ``TransformersEngine`` on the checkpoint; the default KV budget holds ``batch_size``
    requests of ``longest_request`` tokens (prompt + response budget)."""
    import torch

    from rstar2_scheduler import TransformersEngine, TransformersEngineConfig

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    budget = kv_budget if kv_budget is not None else batch_size * longest_request
    if budget < longest_request:
        raise InputError(
            "kv_budget",
            f"{budget} tokens cannot hold one request: the longest prompt plus its response "
            f"budget (`settings.max_tokens`) is {longest_request} tokens",
        )
    config = TransformersEngineConfig(kv_budget_tokens=budget, max_batch_size=batch_size, seed=seed)
    torch_dtype: Any = dtype if dtype != "auto" else ("auto" if device != "cpu" else torch.float32)
    if isinstance(torch_dtype, str) and torch_dtype != "auto":
        torch_dtype = getattr(torch, torch_dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise InputError("dtype", f"{dtype!r} is not a torch dtype (e.g. bfloat16)")
    engine = TransformersEngine.from_pretrained(
        checkpoint, config, device=device, dtype=torch_dtype
    )
    positions = getattr(engine.model.config, "max_position_embeddings", None)
    if positions is not None and longest_request > positions:
        raise InputError(
            "settings.max_tokens",
            f"the longest prompt plus its response budget is {longest_request} tokens, beyond "
            f"the model's context of {positions} tokens; lower the response budget",
        )
    return engine


def api_root(url: str) -> str:
    """An OpenAI-compatible API root: ``http://host:8000`` and ``.../v1`` both give ``.../v1``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError("endpoints", f"{url!r} is not an http(s) URL")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


async def served_models(root: str) -> list[str] | None:
    """The model names an endpoint lists (``GET /models``; None when it answers that with an
    error, as ``transformers serve`` does); InputError when it is not reachable."""
    try:
        async with (
            aiohttp.ClientSession(timeout=PROBE_TIMEOUT) as session,
            session.get(root + "/models") as response,
        ):
            if response.status != 200:
                return None
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as error:
        raise InputError(
            "endpoints", f"{root} is not reachable: {type(error).__name__}: {error}"
        ) from None
    except ValueError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    return [str(entry["id"]) for entry in data or [] if isinstance(entry, dict) and "id" in entry]


async def resolve_served_model(roots: list[str], served_model: str | None) -> str:
    """The model every endpoint serves: ``served_model``, or the one model they all list."""
    model = served_model
    for root in roots:
        names = await served_models(root)
        if model is None:
            if names is None or len(names) != 1:
                listed = "lists no models" if not names else f"serves {names}"
                raise InputError("served_model", f"{root} {listed}; name the model to evaluate")
            model = names[0]
        elif names and model not in names:
            raise InputError("served_model", f"{root} does not serve {model!r}; it serves {names}")
    assert model is not None
    return model


async def endpoint_scheduler(
    engines: Sequence[Engine], *, concurrency: int, longest_request: int
) -> SchedulerConfig:
    """How rollouts are placed on endpoints (started here): at most ``concurrency`` in flight
    per endpoint; live kv-aware admission where every server publishes KV statistics (vLLM,
    SGLang), else a reservation of ``longest_request`` tokens per rollout in room for
    ``concurrency`` of them. A server that cannot serve the rollouts (``EndpointError``: it
    accepts no request shape, or would drop markers the rollout parses) is an InputError."""
    try:
        await asyncio.gather(*(engine.start() for engine in engines))
    except EndpointError as error:
        raise InputError("endpoints", str(error)) from None
    cap = concurrency * len(engines)
    room = concurrency * longest_request
    if all(engine.kv_stats().capacity_tokens for engine in engines):
        return SchedulerConfig(max_concurrency=cap, capacity_tokens=room)
    logger.info("an endpoint publishes no KV statistics: admitting by fixed reservations")
    return SchedulerConfig(
        max_concurrency=cap, reservation="max", overcommit=1.0, capacity_tokens=room
    )


async def open_sandbox(spec: str) -> Sandbox:
    """``local``: fork-servers on this machine (started now); else the URL of an rstar2-sandbox
    service, checked with ``/healthz``."""
    url = await probe_sandbox(spec)
    if url is not None:
        from rstar2_sandbox.client import SandboxClient

        return SandboxClient(url)
    from rstar2_sandbox.local import LocalSandbox

    sandbox = LocalSandbox()
    try:
        await sandbox.start()
    except Exception as error:
        raise InputError("sandbox", f"cannot start a local sandbox: {error}") from None
    return sandbox
