"""``create_app``: the aiohttp application over any ``Dispatcher``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from rstar2_sandbox.api import codejudge, native, sandboxfusion
from rstar2_sandbox.api.common import DISPATCHER, METRICS, RESPONSE_BUDGET, SETTINGS
from rstar2_sandbox.api.limits import BODY_LIMITS, SPOOL_DIR
from rstar2_sandbox.api.streaming import ResponseBudget
from rstar2_sandbox.dispatch import Dispatcher
from rstar2_sandbox.metrics import Metrics
from rstar2_sandbox.settings import ServerSettings

log = logging.getLogger(__name__)


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error leaves as JSON; an unexpected exception is a 500, never a dropped connection."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        # aiohttp's own errors (404, 405) come as text: re-wrap them.
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        body = {"error": exc.reason.lower().replace(" ", "_"), "message": exc.text or exc.reason}
        return web.json_response(body, status=exc.status, headers=headers)
    except Exception as exc:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        body = {"error": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
        return web.json_response(body, status=500)


def create_app(dispatcher: Dispatcher, settings: ServerSettings | None = None) -> web.Application:
    """The service: native, Code Judge and SandboxFusion endpoints over ``dispatcher``.

    The app starts the dispatcher when it starts and closes it when it shuts down.
    """
    settings = settings or ServerSettings()
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[json_errors])
    bodies = {**native.BODIES, **codejudge.BODIES, **sandboxfusion.BODIES}
    app[BODY_LIMITS] = {path: body.limit(settings) for path, body in bodies.items()}
    app[SPOOL_DIR] = settings.spool_dir or ""
    app[DISPATCHER] = dispatcher
    app[SETTINGS] = settings
    app[METRICS] = Metrics(dispatcher.stats)
    app[RESPONSE_BUDGET] = ResponseBudget(settings.response_buffer_mb << 20)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await dispatcher.start()
        yield
        await dispatcher.close()

    app.cleanup_ctx.append(lifecycle)
    app.add_routes(native.routes)
    app.add_routes(codejudge.routes)
    app.add_routes(sandboxfusion.routes)
    return app


__all__ = ["create_app"]
