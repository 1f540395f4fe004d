"""What ``torch.compile`` has cost this process so far: graphs compiled and seconds spent.

Read from torch's own counters and timers, without importing the compiler: a process that never
compiled reports zero. Engines use them to cap their compile time, trainers to report it.
"""

from __future__ import annotations

import sys


def compile_count() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (recompilations
    included); 0 when the compiler was never imported."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_seconds() -> float:
    """Seconds this process has spent compiling with ``torch.compile``: torch's own timers of
    whole-frame compilation and of the backward graphs it compiles at their first use."""
    if "torch._dynamo" not in sys.modules:
        return 0.0
    from torch._dynamo.utils import compilation_time_metrics

    timers = ("_compile.compile_inner", "backward._backward_impl")
    return float(sum(sum(compilation_time_metrics.get(name, [])) for name in timers))
