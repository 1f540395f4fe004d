"""Source converters by name: each turns one public dataset's rows into rstar2 rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rstar2_data.benchmarks import FieldMap
from rstar2_data.converters.base import Converter, RowError, RowKind
from rstar2_data.converters.chat_sources import (
    ApigenMT,
    ChatBuilder,
    Glaive,
    MagicoderToTool,
    Messages,
    NemotronChat,
    ToolAce,
    Xlam,
)
from rstar2_data.converters.chat_sources import Rows as ChatRows
from rstar2_data.converters.math_sources import (
    DapoRaw,
    MappedMath,
    OpenMathReasoning,
    make_problem,
)
from rstar2_data.converters.math_sources import Rows as MathRows

# Recipe ``converter:`` names -> factories. Hub ids each one is written for are in the README.
CONVERTERS: dict[str, Callable[[], Converter[Any]]] = {
    "math_rows": MathRows,
    "chat_rows": ChatRows,
    "messages": Messages,
    "nemotron_chat": NemotronChat,
    "xlam": Xlam,
    "apigen_mt": ApigenMT,
    "toolace": ToolAce,
    "glaive": Glaive,
    "magicoder_oss": MagicoderToTool,
    "magicoder_evol": lambda: MagicoderToTool(instruction="instruction", response="response"),
    "dapo_processed": lambda: MappedMath(FieldMap(problem="prompt", answer="solution")),
    "dapo_raw": DapoRaw,
    "openmathreasoning": OpenMathReasoning,
    "project_euler": lambda: MappedMath(
        FieldMap(id="id", problem="problem", answer="numerical_answer")
    ),
}


def get_converter(name: str) -> Converter[Any]:
    """The converter registered under ``name``."""
    if name not in CONVERTERS:
        raise KeyError(f"unknown converter {name!r}; expected one of {sorted(CONVERTERS)}")
    return CONVERTERS[name]()


__all__ = [
    "CONVERTERS",
    "ApigenMT",
    "ChatBuilder",
    "ChatRows",
    "Converter",
    "DapoRaw",
    "Glaive",
    "MagicoderToTool",
    "MappedMath",
    "MathRows",
    "Messages",
    "NemotronChat",
    "OpenMathReasoning",
    "RowError",
    "RowKind",
    "ToolAce",
    "Xlam",
    "get_converter",
    "make_problem",
]
