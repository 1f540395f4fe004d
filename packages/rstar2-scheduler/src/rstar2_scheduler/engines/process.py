"""A ``TransformersEngine`` in a child process of its own, optionally pinned to CPU cores.

In one process, an engine's forward steps and a trainer's update share one compute thread per
device (``compute.py``), so they take turns. In a child process they run side by side: on a CPU
the engine keeps its cores and the trainer its own, which asynchronous RL needs to overlap
generation with the update without a Ray cluster. The child gets a copy of the model when it
starts; requests, results and new weights travel through a pipe (pickled), and every reply
carries the engine's KV statistics, which ``kv_stats`` returns until the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import threading
from multiprocessing.connection import Connection
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel

from rstar2_scheduler.engine import (
    Capability,
    Engine,
    GenerationRequest,
    GenerationResult,
    KVStats,
    NamedTensors,
)
from rstar2_scheduler.engines.transformers import TransformersEngine, TransformersEngineConfig

logger = logging.getLogger(__name__)


class ProcessEngineConfig(BaseModel):
    """The engine the child runs, and where it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: TransformersEngineConfig
    cpus: tuple[int, ...] | None = Field(
        default=None,
        description="CPU cores the child process may run on (sched_setaffinity); None: any.",
    )
    start_timeout_s: float = Field(default=300.0, gt=0, description="For the child to be ready.")


def _serve(connection: Connection, model: PreTrainedModel, config: ProcessEngineConfig) -> None:
    """The child process: one engine, serving the parent's messages until told to close."""
    if config.cpus is not None:
        os.sched_setaffinity(0, config.cpus)
    if config.engine.torch_threads is not None:
        torch.set_num_threads(config.engine.torch_threads)
    asyncio.run(_child(connection, model, config))


async def _child(
    connection: Connection, model: PreTrainedModel, config: ProcessEngineConfig
) -> None:
    loop = asyncio.get_running_loop()
    engine = TransformersEngine(model, config.engine)
    await engine.start()
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    def receive() -> None:  # a thread: Connection.recv blocks
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                message = ("close", None)
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message[0] == "close":
                return

    threading.Thread(target=receive, name="engine-inbox", daemon=True).start()

    def reply(key: int, value: object) -> None:
        connection.send((key, value, engine.kv_stats()))

    async def generate(key: int, request: GenerationRequest) -> None:
        reply(key, await engine.generate(request))

    async def update(
        key: int, weights: list[tuple[str, torch.Tensor]], version: str | None
    ) -> None:
        try:
            await engine.update_weights(weights, version=version)
        except Exception as error:  # a bad name or shape: the parent raises it
            reply(key, error)
            return
        reply(key, None)

    tasks: set[asyncio.Task[None]] = set()
    connection.send(("ready", os.getpid(), engine.kv_stats()))
    while True:
        kind, *body = await inbox.get()
        if kind == "close":
            await engine.close()  # pending requests end as aborted, and are answered
            await asyncio.gather(*tasks)
            with contextlib.suppress(OSError):
                connection.send(("closed", None, engine.kv_stats()))
            return
        coroutine = generate(*body) if kind == "generate" else update(*body)
        task = loop.create_task(coroutine)
        tasks.add(task)
        task.add_done_callback(tasks.discard)


class ProcessEngine(Engine):
    """Runs a ``TransformersEngine`` over ``model`` in a child process (see the module)."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {"update_weights", "reset_prefix_cache"}
    )
    unsupported_reason: ClassVar[str] = "the engine in the child process does not sleep"

    def __init__(self, model: PreTrainedModel, config: ProcessEngineConfig) -> None:
        self.config = config
        self.name = config.engine.name
        self.pid: int | None = None
        self.weights_version: str | None = None
        self._model: PreTrainedModel | None = model
        self._process: Any = None
        self._connection: Connection | None = None
        self._pending: dict[int | str, asyncio.Future[Any]] = {}
        self._keys = itertools.count()
        self._stats = KVStats(capacity_tokens=config.engine.kv_budget_tokens, used_tokens=0)
        self._lost: str | None = None
        self._started = asyncio.Lock()

    async def start(self) -> None:
        async with self._started:
            if self._process is not None:
                return
            assert self._model is not None, "a closed ProcessEngine does not start again"
            # A fork server started once imports torch and this module; each engine process is
            # forked from it (fast, and from a process without threads, unlike this one).
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])
            parent, child = context.Pipe()
            self._process = context.Process(
                target=_serve,
                args=(child, self._model, self.config),
                name=f"rstar2-{self.name}",
                daemon=True,
            )
            self._process.start()
            child.close()
            self._model = None  # the child has its copy
            self._connection = parent
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Any] = loop.create_future()
            self._pending["ready"] = ready
            threading.Thread(
                target=self._receive, args=(loop, parent), name=f"{self.name}-replies", daemon=True
            ).start()
            self.pid = await asyncio.wait_for(ready, self.config.start_timeout_s)

    def _receive(self, loop: asyncio.AbstractEventLoop, connection: Connection) -> None:
        while True:
            try:
                key, value, stats = connection.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(self._fail_all, "the engine process exited")
                return
            loop.call_soon_threadsafe(self._resolve, key, value, stats)
            if key == "closed":
                return

    def _resolve(self, key: int | str, value: object, stats: KVStats) -> None:
        self._stats = stats
        future = self._pending.pop(key, None)
        if future is not None and not future.done():
            future.set_result(value)

    def _fail_all(self, why: str) -> None:
        self._lost = why
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RuntimeError(f"engine {self.name!r}: {why}"))
        self._pending.clear()

    async def _call(self, kind: str, *body: object) -> Any:
        await self.start()
        if self._lost is not None:
            raise RuntimeError(f"engine {self.name!r}: {self._lost}")
        assert self._connection is not None
        key = next(self._keys)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        self._connection.send((kind, key, *body))
        return await future

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        try:
            result: GenerationResult = await self._call("generate", request)
        except RuntimeError as error:
            return GenerationResult.failed(request.request_id, str(error))
        return result

    def kv_stats(self) -> KVStats:
        """The statistics the child sent with its last reply."""
        return self._stats

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """Send the weights (copied through the pipe) to the child's engine, which takes them
        between requests; a wrong name or shape raises ``ValueError`` here."""
        tensors = [(name, tensor.detach().cpu()) for name, tensor in weights]
        error = await self._call("update", tensors, version)
        if isinstance(error, Exception):
            raise error
        self.weights_version = version

    async def reset_prefix_cache(self) -> None:
        """Nothing to do: the engine keeps no keys or values between requests."""

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if self._connection is not None and self._lost is None:
            with contextlib.suppress(OSError):
                self._connection.send(("close",))
        await asyncio.to_thread(process.join, 30)
        if process.is_alive():
            process.kill()
        self._fail_all("the engine was closed")
