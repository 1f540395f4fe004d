"""Code Judge compatible endpoints (what rStar2-Agent's tool client talks to).

``POST /run`` takes one submission, ``/run/batch`` and ``/run/long-batch`` take
``{"type": "batch", "submissions": [...]}``; ``GET /ping`` answers liveness. Fields a Code Judge
client may send that this service does not use are accepted and ignored, so existing clients work.
"""

from __future__ import annotations

import json
import uuid
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from rstar2_sandbox.api.common import (
    SETTINGS,
    check_batch,
    execute,
    json_bytes,
    parse_body,
    stream_results,
)
from rstar2_sandbox.api.limits import Body, expect_within_limit
from rstar2_sandbox.dispatch import QueueFullError
from rstar2_sandbox.models import (
    DEFAULT_OUTPUT_LIMIT_BYTES,
    MAX_CODE_BYTES,
    MAX_STDIN_BYTES,
    RunRequest,
    RunResult,
    RunStatus,
)

routes = web.RouteTableDef()
# What each body may hold (``limits``): a submission's solution, input and expected output.
_SUBMISSION_CHARS = MAX_CODE_BYTES + 2 * MAX_STDIN_BYTES
BODIES = {
    "/run": Body(_SUBMISSION_CHARS),
    "/run/batch": Body(_SUBMISSION_CHARS, batch=True),
    "/run/long-batch": Body(_SUBMISSION_CHARS, batch=True),
}

# Code Judge's reasons, and one of this service's: the run wrote more than a limit allows
# (stdout/stderr cap, file size, its /tmp quota; stderr ends with a line saying which).
Reason = Literal[
    "",
    "internal_error",
    "worker_timeout",
    "queue_timeout",
    "invalid_input",
    "output_limit_exceeded",
]
_REASONS: dict[RunStatus, Reason] = {
    RunStatus.TIMEOUT: "worker_timeout",
    RunStatus.INTERNAL_ERROR: "internal_error",
    RunStatus.OUTPUT_LIMIT_EXCEEDED: "output_limit_exceeded",
}


class Submission(BaseModel):
    """One Code Judge submission."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["python"] = Field(description="Language; only 'python' is supported.")
    solution: str = Field(max_length=MAX_CODE_BYTES, description="Python source.")
    input: str | None = Field(default=None, max_length=MAX_STDIN_BYTES, description="Stdin.")
    expected_output: str | None = Field(
        default=None,
        max_length=MAX_STDIN_BYTES,
        description="When given, success also needs stdout to match (stripped).",
    )
    sub_id: str | int | None = Field(default=None, description="Caller's id, echoed back.")


class BatchSubmission(BaseModel):
    """A Code Judge batch."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["batch"] = "batch"
    sub_id: str | None = Field(default=None, description="Caller's id of the batch, echoed back.")
    submissions: list[Submission]


class JudgeResult(BaseModel):
    """One Code Judge result."""

    sub_id: str | int
    success: bool
    run_success: bool
    cost: float
    stdout: str
    stderr: str
    reason: Reason


class BatchResult(BaseModel):
    """A Code Judge batch response (streamed by ``_batch`` in this shape)."""

    sub_id: str
    results: list[JudgeResult]


def _judge(
    submission: Submission, result: RunResult | None, output_chars: int | None = None
) -> JudgeResult:
    """Code Judge's view of a result (``None``: the queue refused the call), its stdout and
    stderr cut to ``output_chars`` when given."""
    sub_id = submission.sub_id if submission.sub_id is not None else uuid.uuid4().hex
    if result is None:
        return JudgeResult(
            sub_id=sub_id,
            success=False,
            run_success=False,
            cost=0.0,
            stdout="",
            stderr="",
            reason="queue_timeout",
        )
    run_success = result.ok
    success = run_success and (
        submission.expected_output is None
        or result.stdout.strip() == submission.expected_output.strip()
    )
    return JudgeResult(
        sub_id=sub_id,
        success=success,
        run_success=run_success,
        cost=result.wall_time_s,
        stdout=result.stdout[:output_chars],
        stderr=result.stderr[:output_chars],
        reason=_REASONS.get(result.status, ""),
    )


async def _run(app: web.Application, submission: Submission) -> JudgeResult:
    settings = app[SETTINGS]
    request = RunRequest(
        code=submission.solution,
        stdin=submission.input or "",
        timeout_s=settings.compat_timeout_s,
    )
    try:
        result: RunResult | None = await execute(app, request, "codejudge")
    except QueueFullError:
        result = None
    return _judge(submission, result, settings.codejudge_output_chars)


def _json(model: BaseModel) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


@routes.get("/ping")
async def ping(request: web.Request) -> web.Response:
    """Liveness, as Code Judge answers it."""
    return web.json_response({"status": "ok"})


@routes.post("/run", expect_handler=expect_within_limit)
async def run(request: web.Request) -> web.Response:
    """Run one submission."""
    submission = await parse_body(request, Submission)
    return _json(await _run(request.app, submission))


async def _batch(request: web.Request) -> web.StreamResponse:
    """Run a batch; results streamed in request order (a ``BatchResult``); a call the queue
    refuses gets ``reason: queue_timeout``, as in Code Judge."""
    batch = await parse_body(request, BatchSubmission)
    check_batch(request.app, len(batch.submissions), "submissions")

    async def produce(index: int) -> bytes:
        return json_bytes(await _run(request.app, batch.submissions[index]))

    sub_id = batch.sub_id if batch.sub_id is not None else uuid.uuid4().hex
    head = b'{"sub_id":' + json.dumps(sub_id).encode() + b',"results":['
    # Code Judge calls carry no output cap: each gets the default one (``_run``).
    return await stream_results(
        request,
        len(batch.submissions),
        produce,
        head=head,
        output_limit_bytes=lambda _: DEFAULT_OUTPUT_LIMIT_BYTES,
    )


routes.post("/run/batch", expect_handler=expect_within_limit)(_batch)
routes.post("/run/long-batch", expect_handler=expect_within_limit)(_batch)
