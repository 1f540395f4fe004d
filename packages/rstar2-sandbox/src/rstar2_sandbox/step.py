"""A paper-scale RL step of tool calls against a running service, with exactly-once accounting.

rStar2-Agent sends up to 45,000 tool calls in one RL step. ``step_calls`` builds such a step: a
mix of trivial, numpy, sympy and failing code (``STEP_MIX``), each call printing its own token and
a value that follows from its index (or failing with its token), so that every answer can be
matched to its call and checked.
``run_step`` sends it as rStar2-Agent's client does: each call wrapped in the agent template
(``agent_template.rstar2_agent_wrap``), over the Code Judge batch API, in batches of 64 with 32
batches in flight (the paper's 32 send workers). Items the queue refused (``queue_timeout``) and
batches that failed as a whole (a 503, a cut connection) are sent again, and counted. The report
says how many calls were answered exactly once with their own output, and how many were missing,
answered more than once, or answered wrongly.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence

import aiohttp
from pydantic import BaseModel, ConfigDict, Field
from rich.progress import Progress

from rstar2_sandbox.agent_template import rstar2_agent_wrap
from rstar2_sandbox.api.codejudge import BatchResult, JudgeResult

# kind -> (share of the step, code that prints its token and a value, the value). Failing code
# raises with its token; the template then reports the error (and the token) on stderr.
STEP_MIX: dict[str, tuple[float, str, Callable[[int], str] | None]] = {
    "trivial": (0.40, "print({token!r})\nprint({n} + 1)", lambda n: str(n + 1)),
    "numpy": (
        0.25,
        "import numpy as np\nprint({token!r})\nprint(int(np.arange({n}).sum()))",
        lambda n: str(n * (n - 1) // 2),
    ),
    "sympy": (
        0.15,
        "import sympy as sp\nx = sp.Symbol('x')\nprint({token!r})\nprint(sp.factor(x**2 - {n}**2))",
        lambda n: f"(x - {n})*(x + {n})",
    ),
    "failing": (0.20, "values = [{n}]\nraise ValueError({token!r})", None),
}
RETRY_LIMIT = 20


class StepCall(BaseModel):
    """One tool call of the step and what it must answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    kind: str
    token: str

    @property
    def n(self) -> int:
        """The number its code works on."""
        return 2 + self.index % 97

    @property
    def code(self) -> str:
        """What is sent: the snippet, wrapped as rStar2-Agent's client wraps it (made when sent:
        some 3 KB each)."""
        return rstar2_agent_wrap(STEP_MIX[self.kind][1].format(token=self.token, n=self.n))

    def answered_by(self, result: JudgeResult) -> bool:
        """Whether ``result`` is this call's own: what its code prints, or its error."""
        value = STEP_MIX[self.kind][2]
        if value is None:
            return not result.run_success and f"ValueError at line 2: {self.token}" in result.stderr
        return result.run_success and result.stdout == f"{self.token}\n{value(self.n)}\n"


class StepReport(BaseModel):
    """How a step went: throughput, latency and the accounting of every call."""

    model_config = ConfigDict(extra="forbid")

    calls: int
    answered_once: int = Field(description="Calls answered exactly once, with their own output.")
    missing: int = Field(description="Calls never answered.")
    duplicated: int = Field(description="Calls answered more than once.")
    wrong: int = Field(description="Calls answered once, but not with what their code prints.")
    requeued: int = Field(description="Items refused by a full queue and sent again.")
    resent_batches: int = Field(description="Batches that failed whole and were sent again.")
    by_kind: dict[str, int]
    seconds: float
    calls_per_s: float
    p50_ms: float = Field(description="Per call: from its batch's send to the batch's answer.")
    p99_ms: float
    max_ms: float
    run_p50_ms: float = Field(description="Per call: its run's own wall time (Code Judge cost).")
    run_p99_ms: float


def step_calls(count: int, seed: int = 0) -> list[StepCall]:
    """``count`` calls mixed as ``STEP_MIX`` says, in a shuffled order fixed by ``seed``."""
    rng = random.Random(seed)
    kinds = list(STEP_MIX)
    weights = [STEP_MIX[k][0] for k in kinds]
    return [
        StepCall(index=index, kind=kind, token=uuid.UUID(int=rng.getrandbits(128)).hex)
        for index, kind in enumerate(rng.choices(kinds, weights, k=count))
    ]


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    resent: Callable[[], None],
) -> list[JudgeResult]:
    """POST a batch and read its results; a 502/503/504 or a broken connection is retried with
    backoff (``resent`` counts each), anything else raises."""
    for attempt in range(RETRY_LIMIT):
        try:
            async with session.post(url, json=body) as response:
                if response.status not in (502, 503, 504):
                    response.raise_for_status()
                    return BatchResult.model_validate_json(await response.read()).results
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            pass
        resent()
        await asyncio.sleep(min(5.0, 0.1 * 2**attempt))
    raise RuntimeError(f"a batch failed {RETRY_LIMIT} times in a row at {url}")


def _percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


async def run_step(
    url: str,
    calls: Sequence[StepCall],
    *,
    batch: int = 64,
    concurrency: int = 32,
    halfway: Callable[[], object] | None = None,
    progress: Progress | None = None,
) -> StepReport:
    """Send ``calls`` to the Code Judge batch API at ``url`` and account for every answer.

    ``halfway`` is called once, when half of the calls have been answered (say, to kill a
    worker).
    """
    pending: deque[list[StepCall]] = deque(
        list(calls[offset : offset + batch]) for offset in range(0, len(calls), batch)
    )
    answers: dict[int, list[JudgeResult]] = {}
    latencies: list[float] = []
    run_times: list[float] = []
    requeued = resent = 0
    answered = 0
    task = progress.add_task("tool calls", total=len(calls)) if progress else None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)

    def resend() -> None:
        nonlocal resent
        resent += 1

    async def send(session: aiohttp.ClientSession) -> None:
        nonlocal requeued, answered, halfway
        while pending:
            items = pending.popleft()
            body = {
                "type": "batch",
                "submissions": [
                    {"type": "python", "solution": c.code, "sub_id": c.index} for c in items
                ],
            }
            began = time.perf_counter()
            results = await _post(session, f"{url}/run/long-batch", body, resend)
            elapsed = time.perf_counter() - began
            refused = []
            by_index = {c.index: c for c in items}
            for result in results:
                if result.reason == "queue_timeout":
                    refused.append(by_index[int(result.sub_id)])
                    continue
                answers.setdefault(int(result.sub_id), []).append(result)
                latencies.append(elapsed)
                run_times.append(result.cost)
                answered += 1
            if refused:
                requeued += len(refused)
                pending.append(refused)
            if progress is not None and task is not None:
                progress.update(task, completed=answered)
            if halfway is not None and answered >= len(calls) / 2:
                callback, halfway = halfway, None
                callback()

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(send(session) for _ in range(concurrency)))
    seconds = time.perf_counter() - started

    once = wrong = duplicated = missing = 0
    for call in calls:
        seen = answers.get(call.index, [])
        if not seen:
            missing += 1
        elif len(seen) > 1:
            duplicated += 1
        elif not call.answered_by(seen[0]):
            wrong += 1
        else:
            once += 1
    ordered = sorted(latencies)
    return StepReport(
        calls=len(calls),
        answered_once=once,
        missing=missing,
        duplicated=duplicated,
        wrong=wrong,
        requeued=requeued,
        resent_batches=resent,
        by_kind=dict(Counter(call.kind for call in calls)),
        seconds=seconds,
        calls_per_s=len(calls) / seconds if seconds > 0 else 0.0,
        p50_ms=_percentile(ordered, 0.50),
        p99_ms=_percentile(ordered, 0.99),
        max_ms=ordered[-1] * 1000 if ordered else 0.0,
        run_p50_ms=_percentile(sorted(run_times), 0.50),
        run_p99_ms=_percentile(sorted(run_times), 0.99),
    )
