"""``rstar2-sandbox``: serve the execution service, or benchmark one."""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from rstar2_sandbox.executor.settings import ExecutorSettings, default_preload, default_servers
from rstar2_sandbox.malloc import fix_mmap_threshold


class _OneLineErrors(TyperGroup):
    """click's own errors (an option that does not validate) as the one ``error:`` line every
    other error of this command line is, not click's Usage/Try/Error block. rstar2's other
    command lines do the same through rstar2-data, which this package does not depend on."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        given = sys.argv[1:] if args is None else list(args)
        if not standalone_mode or not given:  # the caller handles errors; or the help
            return super().main(
                args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra
            )
        try:
            result = super().main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )
        except typer.TyperException as error:
            context = getattr(error, "ctx", None)
            hint = f" (see {context.command_path} --help)" if context is not None else ""
            typer.echo(f"error: {error.format_message()}{hint}", err=True)
            sys.exit(error.exit_code)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    help="Isolated, high-throughput execution of untrusted Python.",
    no_args_is_help=True,
    add_completion=False,
    # Plain help: it wraps between words at any width, where rich's option panels cut words.
    rich_markup_mode=None,
)


@app.callback()
def cli() -> None:
    """Isolated, high-throughput execution of untrusted Python: serve it, or benchmark it."""


# Options shared by `serve` and `worker`: both run fork-servers with the same settings.
Servers = Annotated[
    int | None, typer.Option(min=1, help="Fork-servers to run (default: one per usable core).")
]
Preload = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated modules every fork-server imports up front "
        "(default: whichever of numpy, sympy, scipy are installed; '' for none)."
    ),
]
Isolate = Annotated[
    bool,
    typer.Option(
        help="Use per-slot uids, network and mount namespaces where the kernel permits "
        "(/healthz and /v1/info report which are active)."
    ),
]
RedisPrefix = Annotated[
    str,
    typer.Option(help="Prefix of the cluster's Redis keys (the same on front ends and workers)."),
]
LogLevel = Annotated[str, typer.Option(help="Logging level (DEBUG, INFO, WARNING...).")]
TmpSize = Annotated[
    int,
    typer.Option(
        min=1,
        help="Quota of each run's own /tmp in MiB, its working directory included (a tmpfs "
        "no other run sees, emptied after each run; needs mount namespaces).",
    ),
]
ShmSize = Annotated[
    int,
    typer.Option(
        min=1, help="Quota of each run's own /dev/shm in MiB (multiprocessing, shared memory)."
    ),
]


def _executor_settings(
    servers: int | None,
    slots: int | None,
    preload: str | None,
    isolate: bool,
    tmp_size_mb: int,
    shm_size_mb: int,
) -> ExecutorSettings:
    modules = (
        default_preload()
        if preload is None
        else [name.strip() for name in preload.split(",") if name.strip()]
    )
    return ExecutorSettings(
        servers=servers or default_servers(),
        slots=slots,
        preload=modules,
        isolate=isolate,
        tmp_size_mb=tmp_size_mb,
        shm_size_mb=shm_size_mb,
    )


def _prepare_service_process(log_level: str) -> None:
    """Logging, and big buffers returned to the system when freed (see ``malloc``)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    fix_mmap_threshold()


def _fail(message: str) -> NoReturn:
    """One line on stderr and exit code 2: bad input or an unreachable service, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before any fork-server starts: a busy port fails at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        _fail(f"--host: cannot resolve {host!r}: {error.strerror}")
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(1024)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            _fail(f"--port: {host}:{port} is already in use; choose another port with --port")
        if error.errno == errno.EACCES:
            _fail(f"--port: no permission to listen on port {port}; use a port above 1023")
        _fail(f"--host: cannot listen on {host}:{port}: {error.strerror}")
    return sock


def _check_redis(url: str) -> None:
    """Fail in one line when the cluster's Redis is missing, malformed or unreachable."""
    try:
        import redis
    except ImportError:
        _fail("--redis needs the 'cluster' extra: pip install 'rstar2-sandbox[cluster]'")
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    except ValueError as error:
        _fail(f"--redis: {error}")
    try:
        client.ping()
    except redis.RedisError as error:
        _fail(f"--redis: cannot reach {url}: {error}")
    finally:
        client.close()


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="TCP port to listen on (0: any free port).")
    ] = 8080,
    servers: Servers = None,
    slots: Annotated[
        int | None,
        typer.Option(
            help="Calls running at once per tier over all fork-servers (default: 4 per server)."
        ),
    ] = None,
    preload: Preload = None,
    isolate: Isolate = True,
    tmp_size_mb: TmpSize = 256,
    shm_size_mb: ShmSize = 64,
    max_queue: Annotated[
        int, typer.Option(help="Calls allowed to wait for a slot; beyond it: 503 + Retry-After.")
    ] = 16384,
    max_batch: Annotated[int, typer.Option(help="Most calls in one batch request.")] = 4096,
    max_body_mb: Annotated[
        int,
        typer.Option(
            min=1,
            help="Largest request body in MiB. Each endpoint refuses a body over its own limit "
            "(what its calls' code and stdin limits and --max-batch allow, at most this) with a "
            "413, judged by Content-Length before reading and by a running count while reading.",
        ),
    ] = 64,
    response_buffer_mb: Annotated[
        int,
        typer.Option(
            min=1,
            help="Batch results that finished and wait to be streamed, in MiB: the memory they "
            "may take over all responses (beyond it they wait in temporary files), and each "
            "batch's window: a batch admits no further call while its own waiting results "
            "(say, for a client that does not read) reach this.",
        ),
    ] = 64,
    spool_dir: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            writable=True,
            help="Directory of those temporary files (default: the system's).",
        ),
    ] = None,
    codejudge_output_chars: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Cut stdout and stderr of Code Judge API results to their first N characters, "
            "as Code Judge does (it cuts at 1000, which rStar2-Agent's client expects). "
            "Default: not cut.",
        ),
    ] = None,
    redis: Annotated[
        str | None,
        typer.Option(
            help="Redis URL of a cluster (e.g. redis://host:6379/0): queue calls there for "
            "'rstar2-sandbox worker' nodes instead of running them here; the executor options "
            "then belong to the workers. Needs the optional 'cluster' extra."
        ),
    ] = None,
    redis_prefix: RedisPrefix = "rstar2:sandbox",
    log_level: LogLevel = "INFO",
) -> None:
    """Run the HTTP service on this machine: native, Code Judge and SandboxFusion APIs."""
    from aiohttp import web

    from rstar2_sandbox.app import create_app
    from rstar2_sandbox.dispatch import Dispatcher, LocalDispatcher
    from rstar2_sandbox.settings import ServerSettings

    if redis is not None:
        _check_redis(redis)
    sock = _listen(host, port)
    _prepare_service_process(log_level)
    executor = _executor_settings(servers, slots, preload, isolate, tmp_size_mb, shm_size_mb)
    settings = ServerSettings(
        host=host,
        port=port,
        max_queue=max_queue,
        max_batch=max_batch,
        max_body_bytes=max_body_mb << 20,
        response_buffer_mb=response_buffer_mb,
        spool_dir=None if spool_dir is None else str(spool_dir),
        codejudge_output_chars=codejudge_output_chars,
    )
    dispatcher: Dispatcher
    if redis is None:
        dispatcher = LocalDispatcher(executor, max_queue=max_queue)
    else:
        from rstar2_sandbox.cluster import ClusterSettings, RedisDispatcher

        cluster = ClusterSettings(key_prefix=redis_prefix, max_queue=max_queue)
        dispatcher = RedisDispatcher(redis, cluster)
    announce = logging.getLogger("rstar2_sandbox.serve").info
    web.run_app(create_app(dispatcher, settings), sock=sock, print=announce)


@app.command()
def worker(
    redis: Annotated[
        str, typer.Option(help="Redis URL of the cluster's queue (e.g. redis://host:6379/0).")
    ],
    slots: Annotated[
        int | None,
        typer.Option(help="Calls running at once on this node (default: 2 per fork-server)."),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, help="Most calls taken from the queue in one read.")
    ] = 64,
    servers: Servers = None,
    preload: Preload = None,
    isolate: Isolate = True,
    tmp_size_mb: TmpSize = 256,
    shm_size_mb: ShmSize = 64,
    redis_prefix: RedisPrefix = "rstar2:sandbox",
    lease_s: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds after which calls held by a worker that stopped renewing its lease "
            "(it died) go to another worker.",
        ),
    ] = 15.0,
    max_deliveries: Annotated[
        int,
        typer.Option(
            min=1, help="Deliveries of a call before it fails with internal_error (2: one retry)."
        ),
    ] = 2,
    drain_timeout_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="On SIGTERM, seconds running calls get to finish; the rest go back to the queue.",
        ),
    ] = 30.0,
    log_level: LogLevel = "INFO",
) -> None:
    """Run calls from a cluster's Redis queue on this node's fork-servers.

    Needs the optional 'cluster' extra of rstar2-sandbox (the redis package).
    """
    import asyncio

    _check_redis(redis)
    from rstar2_sandbox.cluster import ClusterSettings
    from rstar2_sandbox.cluster.node import run_worker_node

    _prepare_service_process(log_level)
    executor = _executor_settings(servers, slots, preload, isolate, tmp_size_mb, shm_size_mb)
    cluster = ClusterSettings(
        key_prefix=redis_prefix, lease_s=lease_s, max_deliveries=max_deliveries
    )
    asyncio.run(
        run_worker_node(
            redis, cluster, executor, batch_size=batch_size, drain_timeout_s=drain_timeout_s
        )
    )


@app.command()
def bench(
    url: Annotated[str, typer.Option(help="Base URL of a running service.")] = (
        "http://127.0.0.1:8080"
    ),
    snippets: Annotated[
        str, typer.Option(help="Comma-separated snippets: trivial, stdlib, numpy, sympy.")
    ] = "trivial,numpy,sympy",
    sequential_calls: Annotated[
        int,
        typer.Option(min=0, help="Calls made one at a time per snippet (latency; 0 to skip)."),
    ] = 200,
    batch_calls: Annotated[
        int, typer.Option(min=0, help="Calls sent through the batch API per snippet (0 to skip).")
    ] = 2000,
    batch_size: Annotated[int, typer.Option(min=1, help="Calls per batch request.")] = 64,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Batch requests in flight at once during the batch run.")
    ] = 8,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", dir_okay=False, help="Also write the rows to this JSON file."),
    ] = None,
) -> None:
    """Drive a running service with trivial/numpy/sympy snippets; print calls/s and latencies."""
    import asyncio
    import json
    from urllib.parse import urlsplit

    import aiohttp
    from rich.console import Console

    from rstar2_sandbox.bench import SNIPPETS, run_suite, table
    from rstar2_sandbox.client import SandboxClient, SandboxClientError, SandboxUnavailableError

    names = [s.strip() for s in snippets.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SNIPPETS))
    if unknown or not names:
        _fail(f"--snippets: unknown {unknown or names}; choose from {', '.join(SNIPPETS)}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _fail(f"--url: expected http://HOST:PORT of a running service, got {url!r}")
    if json_out is not None and not os.access(json_out.parent.absolute(), os.W_OK | os.X_OK):
        _fail(f"--json: cannot write into {json_out.parent.absolute()} (missing or not writable)")
    console = Console()

    async def go() -> list[dict[str, object]]:
        async with SandboxClient(url, batch_size=batch_size, max_concurrency=concurrency) as client:
            try:
                await client.health()
            except (aiohttp.ClientError, SandboxUnavailableError, TimeoutError) as error:
                _fail(
                    f"--url: no service answers at {url} ({error}); start one with "
                    "'rstar2-sandbox serve' or pass its address with --url"
                )
            rows = await run_suite(
                client,
                url,
                names,
                sequential_calls=sequential_calls,
                batch_calls=batch_calls,
                batch_chunk=batch_size * concurrency,
                console=Console(stderr=True),  # progress; the table goes to stdout
            )
        title = f"rstar2-sandbox at {url} (load {os.getloadavg()[0]:.2f})"
        console.print(table(rows, title, target_column=False))
        return [row.model_dump() for row in rows]

    try:
        data = asyncio.run(go())
    except (SandboxUnavailableError, SandboxClientError) as error:
        typer.echo(f"error: the service at {url} failed during the benchmark: {error}", err=True)
        raise typer.Exit(1) from None
    if json_out is not None:
        tmp = json_out.with_name(json_out.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(json_out)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
