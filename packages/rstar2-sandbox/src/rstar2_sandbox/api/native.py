"""The native API: /v1/run, /v1/run/batch, /v1/info, /healthz, /metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from rstar2_sandbox.api.common import (
    DISPATCHER,
    METRICS,
    SETTINGS,
    check_batch,
    execute,
    json_bytes,
    parse_body,
    queue_full,
    stream_results,
)
from rstar2_sandbox.api.limits import BODY_LIMITS, Body, expect_within_limit
from rstar2_sandbox.dispatch import DispatcherStats, QueueFullError
from rstar2_sandbox.isolation import IsolationReport
from rstar2_sandbox.models import (
    MAX_CODE_BYTES,
    MAX_STDIN_BYTES,
    BatchRequest,
    RunRequest,
)

routes = web.RouteTableDef()
# What each body may hold (``limits``): a call's code and stdin.
BODIES = {
    "/v1/run": Body(MAX_CODE_BYTES + MAX_STDIN_BYTES),
    "/v1/run/batch": Body(MAX_CODE_BYTES + MAX_STDIN_BYTES, batch=True),
}


class Health(BaseModel):
    """Response of ``GET /healthz``."""

    model_config = ConfigDict(extra="forbid")

    status: str = Field(description="'ok' when workers are up, else 'unavailable'.")
    workers: int
    isolation: IsolationReport | None


class Info(BaseModel):
    """Response of ``GET /v1/info``."""

    model_config = ConfigDict(extra="forbid")

    name: str = "rstar2-sandbox"
    version: str
    dispatcher: DispatcherStats
    max_batch: int
    max_body_bytes: int
    body_limits: dict[str, int] = Field(
        description="Largest body each endpoint reads (from the code, stdin and batch limits)."
    )
    max_code_chars: int = MAX_CODE_BYTES
    max_stdin_chars: int = MAX_STDIN_BYTES
    endpoints: list[str]


def _json(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        text=model.model_dump_json(), status=status, content_type="application/json"
    )


@routes.post("/v1/run", expect_handler=expect_within_limit)
async def run(request: web.Request) -> web.Response:
    """Run one call."""
    call = await parse_body(request, RunRequest)
    try:
        result = await execute(request.app, call, "native")
    except QueueFullError as exc:
        raise queue_full(exc) from exc
    return _json(result)


@routes.post("/v1/run/batch", expect_handler=expect_within_limit)
async def run_batch(request: web.Request) -> web.StreamResponse:
    """Run many calls concurrently; results streamed in request order (a ``BatchResponse``)."""
    batch = await parse_body(request, BatchRequest)
    check_batch(request.app, len(batch.requests), "requests")

    async def produce(index: int) -> bytes:
        result = await execute(request.app, batch.requests[index], "native")
        return json_bytes(result)

    try:
        return await stream_results(
            request,
            len(batch.requests),
            produce,
            head=b'{"results":[',
            output_limit_bytes=lambda index: batch.requests[index].output_limit_bytes,
        )
    except QueueFullError as exc:
        raise queue_full(exc) from exc


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """200 while at least one worker is up, 503 otherwise; says which isolation is active."""
    stats = request.app[DISPATCHER].stats()
    up = stats.workers > 0
    health = Health(
        status="ok" if up else "unavailable", workers=stats.workers, isolation=stats.isolation
    )
    return _json(health, 200 if up else 503)


@routes.get("/v1/info")
async def info(request: web.Request) -> web.Response:
    """Version, limits, queue and isolation."""
    from rstar2_sandbox import __version__

    settings = request.app[SETTINGS]
    return _json(
        Info(
            version=__version__,
            dispatcher=request.app[DISPATCHER].stats(),
            max_batch=settings.max_batch,
            max_body_bytes=settings.max_body_bytes,
            body_limits=request.app[BODY_LIMITS],
            endpoints=sorted(
                {r.resource.canonical for r in request.app.router.routes() if r.resource}
            ),
        )
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format."""
    body = generate_latest(request.app[METRICS].registry)
    response = web.Response(body=body)
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    response.charset = "utf-8"
    return response
