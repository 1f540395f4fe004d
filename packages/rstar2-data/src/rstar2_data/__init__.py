"""rstar2-data.

Dataset recipes, converters, filters and decontamination for agentic math RL, the synthetic demo
task, and the agent protocol (``rstar2_data.protocol``: tags, system prompt, chat template, the
one ``ToolCall``; ``rstar2_data.tools``: the Python tool's schema) shared by data, rollouts and
evaluation.
"""

from importlib.metadata import version

from rstar2_data.answers import canonical_integer, integer_digits, normalize_integer, unwrap_boxed
from rstar2_data.build import BuildError, Manifest, build, load_built, read_manifest
from rstar2_data.converters import CONVERTERS, Converter, RowError, get_converter
from rstar2_data.filters import Filter, FilterReport
from rstar2_data.protocol import CHAT_TEMPLATE, FunctionCall, ToolCall, user_prompt
from rstar2_data.recipe import Recipe, RecipeError, load_recipe, parse_recipe, shipped_recipes
from rstar2_data.schemas import (
    AnswerKind,
    ChatExample,
    ChatMessage,
    GradedSample,
    MathProblem,
    Role,
)
from rstar2_data.tokenizer import DEFAULT_VOCAB_SIZE, PreSplit, build_tokenizer
from rstar2_data.tools import (
    PYTHON_TOOL_NAME,
    RELEASE_PYTHON_TOOL_NAME,
    python_tool_arguments,
    python_tool_schema,
)

__version__ = version("rstar2-data")

__all__ = [
    "CHAT_TEMPLATE",
    "CONVERTERS",
    "DEFAULT_VOCAB_SIZE",
    "PYTHON_TOOL_NAME",
    "RELEASE_PYTHON_TOOL_NAME",
    "AnswerKind",
    "BuildError",
    "ChatExample",
    "ChatMessage",
    "Converter",
    "Filter",
    "FilterReport",
    "FunctionCall",
    "GradedSample",
    "Manifest",
    "MathProblem",
    "PreSplit",
    "Recipe",
    "RecipeError",
    "Role",
    "RowError",
    "ToolCall",
    "__version__",
    "build",
    "build_tokenizer",
    "canonical_integer",
    "get_converter",
    "integer_digits",
    "load_built",
    "load_recipe",
    "normalize_integer",
    "parse_recipe",
    "python_tool_arguments",
    "python_tool_schema",
    "read_manifest",
    "shipped_recipes",
    "unwrap_boxed",
    "user_prompt",
]
