"""Stand-in measurements for the benchmark's row runner (``bench/isolated_rows.py``): rows that
finish, stall, fail or crash, without torch."""

from __future__ import annotations

import os
import time
from typing import Any

from isolated_rows import Events, Row


def behave(row: Row, settings: dict[str, Any], events_path: str) -> None:
    """Do what the row's label says: ``finish``, ``stall``, ``fail`` or ``crash``."""
    os.setsid()
    events = Events(events_path, row)
    events.progress("started")
    if row.label == "finish":
        time.sleep(settings.get("work_s", 0.0))
        events.write(result={"value": 1})
    elif row.label == "stall":
        events.progress("stalling")
        time.sleep(3600)
    elif row.label == "fail":
        events.write(error="ValueError: no")
        raise SystemExit(1)
    elif row.label == "crash":
        os._exit(3)
