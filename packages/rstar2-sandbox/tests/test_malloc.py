"""``fix_mmap_threshold``: a freed big buffer leaves the process, as the service's memory needs."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# After one 24 MiB buffer is freed (which raises glibc's dynamic threshold past 20 MiB), how much
# of a 20 MiB buffer, allocated between small objects and freed, the process still holds (KiB).
_HELD_AFTER_FREE = """
import sys
from rstar2_sandbox import fix_mmap_threshold

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
first = bytearray(24 << 20)
del first
before = rss_kib()
below = [bytearray(1000) for _ in range(10)]
buffer = bytearray(20 << 20)
above = [bytearray(1000) for _ in range(10)]
del buffer
print(rss_kib() - before)
"""


def held_kib(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _HELD_AFTER_FREE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's threshold is glibc's")
def test_a_fixed_threshold_returns_a_freed_big_buffer_to_the_system() -> None:
    assert held_kib("default") > 16 << 10  # the 20 MiB stayed in the heap
    assert held_kib("fixed") < 1 << 10
