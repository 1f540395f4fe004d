"""SandboxFusion compatible endpoint ``POST /run_code`` (what verl's sandbox tool talks to).

Fields of SandboxFusion requests this service does not use are accepted and ignored.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from rstar2_sandbox.api.common import execute, parse_body, queue_full
from rstar2_sandbox.api.limits import Body, expect_within_limit
from rstar2_sandbox.dispatch import QueueFullError
from rstar2_sandbox.models import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    MAX_CODE_BYTES,
    MAX_STDIN_BYTES,
    RunRequest,
    RunResult,
    RunStatus,
)

routes = web.RouteTableDef()
# What the body may hold (``limits``): the code and stdin.
BODIES = {"/run_code": Body(MAX_CODE_BYTES + MAX_STDIN_BYTES)}


class RunCodeRequest(BaseModel):
    """Body of ``POST /run_code``."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(max_length=MAX_CODE_BYTES)
    language: Literal["python", "python3"] = Field(
        default="python", description="Only Python is supported."
    )
    stdin: str | None = Field(default=None, max_length=MAX_STDIN_BYTES)
    run_timeout: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=300)
    memory_limit_MB: int = Field(default=DEFAULT_MEMORY_MB, gt=0, le=65536)  # noqa: N815


class CommandRunResult(BaseModel):
    """SandboxFusion's ``run_result``."""

    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float
    return_code: int | None
    stdout: str
    stderr: str


class RunCodeResponse(BaseModel):
    """Response of ``POST /run_code``."""

    status: Literal["Success", "Failed", "SandboxError"]
    message: str
    compile_result: None = None
    run_result: CommandRunResult | None
    executor_pod_name: None = None
    files: dict[str, str] = Field(default_factory=dict)


def _fusion(result: RunResult) -> RunCodeResponse:
    if result.status is RunStatus.INTERNAL_ERROR:
        return RunCodeResponse(status="SandboxError", message=result.stderr, run_result=None)
    run_status: Literal["Finished", "Error", "TimeLimitExceeded"] = "Finished"
    if result.status is RunStatus.TIMEOUT:
        run_status = "TimeLimitExceeded"
    elif result.status is RunStatus.OUTPUT_LIMIT_EXCEEDED:
        run_status = "Error"
    return RunCodeResponse(
        status="Success" if result.ok else "Failed",
        message="" if result.ok else result.status.value,
        run_result=CommandRunResult(
            status=run_status,
            execution_time=result.wall_time_s,
            return_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
        ),
    )


@routes.post("/run_code", expect_handler=expect_within_limit)
async def run_code(request: web.Request) -> web.Response:
    """Run one piece of code, SandboxFusion style."""
    body = await parse_body(request, RunCodeRequest)
    call = RunRequest(
        code=body.code,
        stdin=body.stdin or "",
        timeout_s=body.run_timeout,
        memory_mb=body.memory_limit_MB,
    )
    try:
        result = await execute(request.app, call, "sandboxfusion")
    except QueueFullError as exc:
        raise queue_full(exc) from exc
    return web.Response(text=_fusion(result).model_dump_json(), content_type="application/json")
