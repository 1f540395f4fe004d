"""Scheduler benchmark: ``rstar2-scheduler bench`` with the committed timeline as output.

Run from the repository root: ``uv run python packages/rstar2-scheduler/bench/bench.py``
(extra arguments go to ``rstar2-scheduler bench``; see ``--help``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rstar2_scheduler.cli import app

DOCS = Path(__file__).resolve().parent.parent / "docs"

if __name__ == "__main__":
    app(["bench", "--plot", str(DOCS / "bench_timeline.png"), *sys.argv[1:]])
