"""The frames a pool and its fork-server exchange over the fork-server's stdin and stdout.

To the fork-server: its configuration, then one request per call, each a JSON object after its
length (``REQUEST``). Back: one message per frame, a JSON object and then raw bytes (``MESSAGE``:
both lengths, then both parts). A result's output streams travel as those raw bytes, stdout then
stderr, with ``stdout_bytes`` in the JSON saying where they split: a result can hold tens of
megabytes of output, and as text inside JSON each side would make several copies of it (decode,
escape, encode; parse), which is what the pool's process holds at its peak.

Standard library only: the fork-server imports it.
"""

from __future__ import annotations

import json
import struct
from typing import Any

REQUEST = struct.Struct(">I")
MESSAGE = struct.Struct(">II")


def request_frame(message: dict[str, Any]) -> bytes:
    """A request (or the configuration) as the fork-server reads it."""
    data = json.dumps(message).encode()
    return REQUEST.pack(len(data)) + data


def message_header(message: dict[str, Any], raw_bytes: int) -> bytes:
    """The start of a frame from the fork-server: the lengths and the JSON; ``raw_bytes`` bytes
    follow it."""
    data = json.dumps(message).encode()
    return MESSAGE.pack(len(data), raw_bytes) + data


def result_streams(result: dict[str, Any], raw: bytes | bytearray) -> dict[str, Any]:
    """A result message's fields with ``stdout`` and ``stderr`` filled in from the frame's raw
    bytes, decoded as the run's own interpreter would print them (invalid UTF-8 replaced)."""
    split = int(result.pop("stdout_bytes"))
    view = memoryview(raw)
    result["stdout"] = str(view[:split], "utf-8", "replace")
    result["stderr"] = str(view[split:], "utf-8", "replace")
    return result
