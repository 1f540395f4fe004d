"""One thread per device for the torch work that asyncio code hands off its event loop.

On a CPU, every OS thread that runs a parallel torch op gets its own OpenMP team of worker
threads. With work handed to whichever pool thread is free (``asyncio.to_thread``), an engine's
decode steps and a trainer's update start teams on several threads that then spin for the same
cores: on 2 cores, 40 decode steps of a tiny model took 0.135 s from a second thread against
0.073 s from one thread that does all the torch work. Engines and trainers in one process
therefore run their torch calls on the one thread of their device, which also serialises them
where they would only contend (one CPU, one GPU) and keeps separate devices concurrent.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_executors: dict[str, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def device_executor(device: str) -> ThreadPoolExecutor:
    """The single-thread executor of ``device`` (``"cpu"``, ``"cuda:0"``, ...), made on first
    use and kept for the life of the process."""
    with _lock:
        executor = _executors.get(device)
        if executor is None:
            name = "rstar2-compute-" + device.replace(":", "")
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
            _executors[device] = executor
        return executor


async def run_on_device(
    device: str, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """Await ``function(*args, **kwargs)`` run on ``device``'s compute thread."""
    loop = asyncio.get_running_loop()
    call = functools.partial(function, *args, **kwargs)
    return await loop.run_in_executor(device_executor(device), call)
