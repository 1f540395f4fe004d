"""Read what an offline W&B run wrote: the records of its ``run-<id>.wandb`` file.

The file is a LevelDB-style log (W&B's transaction log): a 7-byte file header, then 32 KiB
blocks of records, each a 7-byte header (checksum, length, type) and a piece of a protobuf
``Record``; a record longer than what is left of a block continues in the next ones.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[Any]:
    """Every ``wandb_internal_pb2.Record`` in an offline run file, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records: list[Any] = []
    pending = b""
    position = _HEADER
    while position + _HEADER <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER:  # the rest of a block too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + _HEADER])
        if kind == 0:  # zero padding at the end of the file
            break
        payload = data[position + _HEADER : position + _HEADER + length]
        position += _HEADER + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + payload)
            records.append(record)
            pending = b""
        else:
            pending = (pending if kind == _MIDDLE else b"") + payload
    return records


def offline_run(run_dir: Path) -> Path:
    """The one offline run file under a stage's ``wandb`` folder."""
    (found,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return found
