"""Engines and sandboxes that follow a script, for testing the rollout loop exactly."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_scheduler.engine import Engine, GenerationRequest, GenerationResult, KVStats


class ScriptedEngine(Engine):
    """Returns scripted completions in order; log-prob of token i is -(i + 1) / 100.

    A script entry is token ids, or a ``GenerationResult`` returned as is (errors, aborts).
    Every request is recorded so tests can check the prompts the rollout sent.
    """

    def __init__(self, script: Sequence[list[int] | GenerationResult], name: str = "scripted"):
        self.name = name
        self.script = list(script)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        entry = self.script[len(self.requests) - 1]
        if isinstance(entry, GenerationResult):
            return entry
        tokens = entry[: request.sampling.max_new_tokens]
        stops = request.sampling.stop_token_ids
        ended = bool(tokens) and tokens[-1] in stops
        return GenerationResult(
            request_id=request.request_id,
            token_ids=tuple(tokens),
            logprobs=tuple(-(i + 1) / 100 for i in range(len(tokens))),
            finish_reason="stop" if ended else "length",
        )

    def kv_stats(self) -> KVStats:
        return KVStats(capacity_tokens=0, used_tokens=0)


class FakeSandbox:
    """Answers each run with the next scripted result, or with what ``respond`` makes of it."""

    def __init__(self, respond: Callable[[RunRequest], RunResult] | None = None) -> None:
        self.requests: list[RunRequest] = []
        self.respond = respond or (lambda r: RunResult(status=RunStatus.SUCCESS, stdout="42\n"))

    async def run(self, request: RunRequest) -> RunResult:
        self.requests.append(request)
        return self.respond(request)

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        return [await self.run(request) for request in requests]

    async def aclose(self) -> None:
        pass
