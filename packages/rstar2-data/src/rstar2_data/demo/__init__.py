"""The synthetic demo task: integer problems that need the Python tool, and SFT transcripts."""

from rstar2_data.demo.generator import (
    DEMO_SOURCE,
    ToolResponseFormatter,
    demo_problems,
    demo_transcripts,
    generate_tasks,
    plain_tool_response,
    to_problem,
    to_transcript,
)
from rstar2_data.demo.runner import Execution, run_python
from rstar2_data.demo.tasks import FAMILIES, LEVELS, Level, TaskInstance

__all__ = [
    "DEMO_SOURCE",
    "FAMILIES",
    "LEVELS",
    "Execution",
    "Level",
    "TaskInstance",
    "ToolResponseFormatter",
    "demo_problems",
    "demo_transcripts",
    "generate_tasks",
    "plain_tool_response",
    "run_python",
    "to_problem",
    "to_transcript",
]
