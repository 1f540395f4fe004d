"""Big buffers go back to the system as soon as they are freed, in the service's processes.

glibc's ``malloc`` maps a buffer above its threshold on its own and unmaps it when freed, but
raises the threshold to the size of each such buffer freed (up to 32 MiB). After the first big
result or body, the service's big buffers then come from the heap, where freed space stays with
the process and fragments: a native batch of eight 24 MiB results grew the front end by 144-168
MiB, three times its 64 MiB window, against 96 MiB with the threshold fixed at 1 MiB (the result
in flight, in its forms on the way: read, decoded, serialised). Mapping and unmapping costs a few
system calls per buffer above 1 MiB, which only big results and bodies have.

Only the ``serve`` and ``worker`` commands call this: a library does not change its host
process's allocator.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>
MMAP_THRESHOLD_BYTES = 1 << 20


def fix_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Have glibc map every buffer of at least ``threshold_bytes`` on its own, for good; False
    (and nothing changed) where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: big buffers stay with malloc's defaults")
        return False
    return bool(mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold_bytes)))
