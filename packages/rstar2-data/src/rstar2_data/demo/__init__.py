"""The synthetic demo task: integer problems that need the Python tool, and SFT transcripts."""

from rstar2_data.demo.generator import (
    DEFAULT_HELDOUT_SHARE,
    DEMO_SOURCE,
    SPLITS,
    Split,
    ToolResponseFormatter,
    demo_problems,
    demo_transcripts,
    generate_tasks,
    plain_tool_response,
    task_split,
    to_problem,
    to_transcript,
)
from rstar2_data.demo.runner import Execution, run_python
from rstar2_data.demo.tasks import FAMILIES, LEVELS, Level, TaskInstance

__all__ = [
    "DEFAULT_HELDOUT_SHARE",
    "DEMO_SOURCE",
    "FAMILIES",
    "LEVELS",
    "SPLITS",
    "Execution",
    "Level",
    "Split",
    "TaskInstance",
    "ToolResponseFormatter",
    "demo_problems",
    "demo_transcripts",
    "generate_tasks",
    "plain_tool_response",
    "run_python",
    "task_split",
    "to_problem",
    "to_transcript",
]
