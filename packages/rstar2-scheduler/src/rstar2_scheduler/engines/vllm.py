"""vLLM's in-process async engine (``AsyncLLM``) behind the ``Engine`` interface.

Needs the optional extra: ``pip install "rstar2-scheduler[vllm]"``; vLLM is imported on ``start``.

What has been run: this module is written and type-checked against vLLM 0.32.0's API
(``AsyncLLM.from_engine_args``, ``generate`` with ``TokensPrompt``, ``StatLoggerBase``,
``reset_prefix_cache``, ``sleep``/``wake_up``, the weight-transfer calls), and vLLM 0.32.0 imports
on a CPU-only machine. What has not: no GPU with vLLM was available, so no model has been loaded
or served through this class, and its generation, statistics, weight updates and sleep/wake are
untested.

Weights reach the engine through vLLM's CUDA-IPC weight-transfer backend: the trainer's tensors
(on a GPU of the same node) are shared by handle in buckets, never written to disk. Engines on
other nodes need vLLM's NCCL backend, which is driven from the trainer's process group.

Token ids go in and out unchanged. Log-probs are those of the sampled tokens; the engine is
started with ``logprobs_mode="processed_logprobs"`` so they are temperature-scaled, matching what
the trainer recomputes. KV statistics come from vLLM's own scheduler statistics through a stat
logger: cache usage (``kv_cache_usage``), running and waiting requests, preemptions.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

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

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


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
        "enable_sleep_mode, enable_prefix_caching.",
    )
    weight_bucket_mb: int = Field(
        default=512, gt=0, description="update_weights shares weights in buckets of this size."
    )


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

    class _KVStatLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is untyped here
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
        seed=sampling.seed,
        stop_token_ids=list(sampling.stop_token_ids),
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _ipc_args(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What another process needs to open ``tensor``'s CUDA memory (rebuild_cuda_tensor args)."""
    from torch.multiprocessing.reductions import reduce_tensor

    args: tuple[Any, ...] = reduce_tensor(tensor)[1]  # type: ignore[no-untyped-call]
    return args


class VLLMEngine(Engine):
    """Generates with an in-process vLLM ``AsyncLLM``; takes RL weights and sleeps for colocation
    (start vLLM with ``enable_sleep_mode`` in ``engine_args`` for ``sleep``)."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {"update_weights", "reset_prefix_cache", "sleep"}
    )

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        self.name = config.name
        self._llm: AsyncLLM | None = None
        self._stats = _Statistics()
        self._capacity = 0
        self._transfer_ready = False

    @property
    def llm(self) -> AsyncLLM:
        """The running vLLM engine (after ``start``)."""
        if self._llm is None:
            raise RuntimeError(f"{self.name}: call start() first")
        return self._llm

    async def start(self) -> None:
        if self._llm is not None:
            return
        _require_vllm()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        arguments = {
            "logprobs_mode": "processed_logprobs",
            "weight_transfer_config": {"backend": "ipc"},
            **self.config.engine_args,
        }
        engine_args = AsyncEngineArgs(model=self.config.model, **arguments)
        self._llm = AsyncLLM.from_engine_args(
            engine_args, stat_loggers=[_stat_logger_factory(self._stats)]
        )
        cache = self._llm.vllm_config.cache_config
        self._capacity = int(cache.num_gpu_blocks or 0) * int(cache.block_size)

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()

    def kv_stats(self) -> KVStats:
        return KVStats(
            capacity_tokens=self._capacity,
            used_tokens=round(min(1.0, max(0.0, self._stats.usage)) * self._capacity),
            running=self._stats.running,
            waiting=self._stats.waiting,
            preemptions=self._stats.preemptions,
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        await self.start()
        from vllm import TokensPrompt

        params = vllm_sampling_params(request.sampling)
        final = None
        try:
            async for output in self.llm.generate(
                TokensPrompt(prompt_token_ids=list(request.prompt_ids)),
                params,
                request.request_id,
            ):
                final = output
        except Exception as failure:  # an engine failure fails this request only
            logger.warning("%s: request %s failed: %r", self.name, request.request_id, failure)
            return GenerationResult.failed(
                request.request_id, f"{type(failure).__name__}: {failure}"
            )
        if final is None or not final.outputs:
            return GenerationResult.failed(request.request_id, "vLLM returned no output")
        completion = final.outputs[0]
        token_ids = [int(token) for token in completion.token_ids]
        logprobs = [
            float(position[token].logprob)
            for position, token in zip(completion.logprobs or [], token_ids, strict=False)
        ]
        reason = _FINISH.get(str(completion.finish_reason))
        if reason is None or len(logprobs) != len(token_ids):
            return GenerationResult.failed(
                request.request_id,
                f"unexpected vLLM output: finish_reason {completion.finish_reason!r}, "
                f"{len(token_ids)} tokens, {len(logprobs)} log-probs",
            )
        return GenerationResult(
            request_id=request.request_id,
            token_ids=tuple(token_ids),
            logprobs=tuple(logprobs),
            finish_reason=reason,
        )

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """Share ``weights`` with vLLM's workers by CUDA IPC handle, bucket by bucket, then drop
        the stale prefix cache. The tensors must be on (or are copied to) this node's GPU."""
        from vllm.distributed.weight_transfer.base import (
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )

        if not torch.cuda.is_available():
            raise self._unsupported("update weights without a CUDA device on this node")
        llm = self.llm
        if not self._transfer_ready:
            request = WeightTransferInitRequest(init_info={"packed": False})
            await llm.init_weight_transfer_engine(request)
            self._transfer_ready = True
        device = torch.cuda.current_device()
        gpu = str(torch.cuda.get_device_properties(device).uuid)
        limit = self.config.weight_bucket_mb * 2**20
        await llm.start_weight_update()
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0

        async def flush() -> None:
            nonlocal bucket, size
            if not bucket:
                return
            torch.cuda.synchronize(device)  # the copies must land before vLLM reads them
            info = {
                "names": [name for name, _ in bucket],
                "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "ipc_handles": [{gpu: _ipc_args(tensor)} for _, tensor in bucket],
            }
            await llm.update_weights(WeightTransferUpdateRequest(update_info=info))
            bucket, size = [], 0  # vLLM has copied them: the shared tensors may go

        for name, tensor in weights:
            shared = tensor.detach().to(device, non_blocking=True).contiguous()
            bucket.append((name, shared))
            size += shared.numel() * shared.element_size()
            if size >= limit:
                await flush()
        await flush()
        await llm.finish_weight_update(version)
        await self.reset_prefix_cache()

    async def reset_prefix_cache(self) -> None:
        """Forget cached prefixes (they were computed with the old weights)."""
        await self.llm.reset_prefix_cache()

    async def sleep(self, level: int = 1) -> None:
        """Free GPU memory for colocated training (level 1 offloads weights, 2 discards them)."""
        await self.llm.sleep(level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Reload what ``sleep`` freed (``tags``: e.g. ["weights"] or ["kv_cache"]; all when
        None)."""
        await self.llm.wake_up(tags)
