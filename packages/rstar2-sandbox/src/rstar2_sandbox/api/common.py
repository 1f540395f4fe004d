"""What every endpoint shares: app state keys, body parsing with field-naming errors, execution."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rstar2_sandbox.api.limits import read_body
from rstar2_sandbox.api.streaming import ResponseBudget, result_bytes, stream_batch
from rstar2_sandbox.dispatch import Dispatcher, QueueFullError
from rstar2_sandbox.metrics import Metrics
from rstar2_sandbox.models import RunRequest, RunResult
from rstar2_sandbox.settings import ServerSettings

DISPATCHER = web.AppKey("dispatcher", Dispatcher)
SETTINGS = web.AppKey("settings", ServerSettings)
METRICS = web.AppKey("metrics", Metrics)
RESPONSE_BUDGET = web.AppKey("response_budget", ResponseBudget)

ModelT = TypeVar("ModelT", bound=BaseModel)
# Calls of one batch running or queued at once, at least: enough to keep a cluster's workers
# fed (each holds up to twice its slots) while the batch's window is open.
MIN_AHEAD = 64


_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    404: web.HTTPNotFound,
    422: web.HTTPUnprocessableEntity,
    500: web.HTTPInternalServerError,
    503: web.HTTPServiceUnavailable,
}


def json_error(status: int, error: str, message: str, **extra: Any) -> web.HTTPException:
    """An HTTP error whose body is ``{"error": ..., "message": ..., ...}``."""
    body = json.dumps({"error": error, "message": message, **extra})
    cls = _ERRORS.get(status, web.HTTPBadRequest)
    return cls(text=body, content_type="application/json")


def field_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic errors as ``{"field": "a.0.b", "message": ...}`` (the field named first)."""
    return [
        {
            "field": ".".join(str(part) for part in error["loc"]) or "(body)",
            "message": error["msg"],
        }
        for error in exc.errors(include_url=False)
    ]


def invalid(exc: ValidationError) -> web.HTTPException:
    """A 422 naming every invalid field."""
    errors = field_errors(exc)
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return json_error(422, "invalid_request", summary, fields=errors)


async def parse_body(request: web.Request, model: type[ModelT]) -> ModelT:
    """The request body, judged by its size as it arrives (``limits``), validated as ``model``;
    400/413/422 with a precise message otherwise."""
    raw = await read_body(request)
    try:
        # Straight from the bytes: no intermediate dicts, so a large batch costs less memory.
        return model.model_validate_json(raw)
    except ValidationError as exc:
        malformed = [e for e in exc.errors(include_url=False) if e["type"] == "json_invalid"]
        if malformed:
            message = f"request body is not valid JSON: {malformed[0]['msg']}"
            raise json_error(400, "malformed_json", message) from exc
        raise invalid(exc) from exc


def json_bytes(model: BaseModel) -> bytes:
    """``model`` as JSON bytes, without the text copy ``model_dump_json().encode()`` makes (a
    result can hold megabytes of output)."""
    return model.__pydantic_serializer__.to_json(model)


def queue_full(exc: QueueFullError) -> web.HTTPException:
    """503 with Retry-After (whole seconds, at least 1)."""
    error = json_error(503, "queue_full", str(exc), retry_after_s=exc.retry_after_s)
    error.headers["Retry-After"] = str(max(1, round(exc.retry_after_s + 0.499)))
    return error


async def execute(app: web.Application, request: RunRequest, api: str) -> RunResult:
    """Submit one call to the dispatcher and count it; ``QueueFullError`` propagates."""
    metrics = app[METRICS]
    started = time.monotonic()
    try:
        result = await app[DISPATCHER].submit(request)
    except QueueFullError:
        metrics.rejected.labels(api=api).inc()
        raise
    metrics.observe(api, result, time.monotonic() - started)
    return result


def check_batch(app: web.Application, size: int, field: str) -> None:
    """Refuse a batch over the size limit (422) or one the queue cannot take whole (503)."""
    settings = app[SETTINGS]
    if size > settings.max_batch:
        raise json_error(
            422,
            "invalid_request",
            f"{field}: at most {settings.max_batch} items per batch, got {size}",
            fields=[{"field": field, "message": f"at most {settings.max_batch} items"}],
        )
    stats = app[DISPATCHER].stats()
    room = stats.queue_limit - stats.queue_depth + max(0, stats.slots - stats.in_flight)
    if size > room:
        app[METRICS].rejected.labels(api="batch").inc(size)
        raise queue_full(QueueFullError(1.0, f"the execution queue has room for {room} calls"))


async def stream_results(
    request: web.Request,
    count: int,
    produce: Callable[[int], Awaitable[bytes]],
    *,
    head: bytes,
    output_limit_bytes: Callable[[int], int],
    tail: bytes = b"]}",
) -> web.StreamResponse:
    """A batch response streamed in request order within the app's response budget and window
    (item ``i``'s calls cap each output stream at ``output_limit_bytes(i)``); up to twice as
    many calls ahead as the dispatcher has slots (at least ``MIN_AHEAD``)."""
    settings = request.app[SETTINGS]
    slots = request.app[DISPATCHER].stats().slots
    return await stream_batch(
        request,
        count=count,
        produce=produce,
        head=head,
        tail=tail,
        budget=request.app[RESPONSE_BUDGET],
        window_bytes=settings.response_buffer_mb << 20,
        ahead=max(MIN_AHEAD, 2 * slots),
        reserve=lambda index: result_bytes(output_limit_bytes(index)),
        spool_dir=settings.spool_dir,
    )
