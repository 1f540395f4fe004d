"""rstar2-data.

Dataset recipes, converters, filters and decontamination for agentic math RL, the Python tool
definition shared by data and rollouts, and the synthetic demo task.
"""

from importlib.metadata import version

from rstar2_data.answers import normalize_integer, unwrap_boxed
from rstar2_data.schemas import (
    AnswerKind,
    ChatExample,
    ChatMessage,
    FunctionCall,
    GradedSample,
    MathProblem,
    Role,
    ToolCall,
)
from rstar2_data.tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer
from rstar2_data.tools import (
    PYTHON_TOOL_NAME,
    RELEASE_PYTHON_TOOL_NAME,
    python_tool_arguments,
    python_tool_schema,
)

__version__ = version("rstar2-data")

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "PYTHON_TOOL_NAME",
    "RELEASE_PYTHON_TOOL_NAME",
    "AnswerKind",
    "ChatExample",
    "ChatMessage",
    "FunctionCall",
    "GradedSample",
    "MathProblem",
    "Role",
    "ToolCall",
    "__version__",
    "build_tokenizer",
    "normalize_integer",
    "python_tool_arguments",
    "python_tool_schema",
    "unwrap_boxed",
]
