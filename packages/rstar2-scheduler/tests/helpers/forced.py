"""An engine that forces chosen turns of chosen rollouts and samples every other turn for real.

A random model almost never writes a valid tool call, so end-to-end tests force the turns that
must call the tool. A forced turn returns the chosen tokens with the model's own log-probs of them
(one teacher-forced forward pass, temperature-scaled); every other turn goes to the wrapped engine
and is sampled by it. The rollout loop cannot tell the two apart.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from rstar2_scheduler.engine import Engine, GenerationRequest, GenerationResult, KVStats


class ForcedTurnsEngine(Engine):
    """Wraps ``inner``; ``forced[rollout_id][turn]`` is the token ids that turn must produce."""

    def __init__(
        self, inner: Engine, model: PreTrainedModel, forced: dict[str, dict[int, list[int]]]
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = model
        self.forced = forced
        self.forced_requests: list[str] = []

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def kv_stats(self) -> KVStats:
        return self.inner.kv_stats()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        rollout_id, _, turn = request.request_id.rpartition("-")
        tokens = self.forced.get(rollout_id, {}).get(int(turn))
        if tokens is None:
            return await self.inner.generate(request)
        self.forced_requests.append(request.request_id)
        tokens = tokens[: request.sampling.max_new_tokens]
        ids = torch.tensor([[*request.prompt_ids, *tokens]])
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0].float()
        temperature = request.sampling.temperature or 1.0
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
        start = len(request.prompt_ids) - 1
        ended = bool(tokens) and tokens[-1] in request.sampling.stop_token_ids
        return GenerationResult(
            request_id=request.request_id,
            token_ids=tuple(tokens),
            logprobs=tuple(float(log_probs[start + i, t]) for i, t in enumerate(tokens)),
            finish_reason="stop" if ended else "length",
        )
