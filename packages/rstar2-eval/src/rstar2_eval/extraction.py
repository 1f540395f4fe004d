"""Final-answer extraction from a model response.

The paper's rule: the answer is the ``\\boxed{...}`` inside the response's answer block (the
protocol's answer tags, ``rstar2_data.protocol.ANSWER_OPEN``/``ANSWER_CLOSE``). The
released code instead took the last ``\\boxed{}`` anywhere in the response; rstar2 offers that as
an opt-in fallback and marks which rule produced each answer, so reports can show how often the
fallback mattered.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_data.protocol import ANSWER_CLOSE, ANSWER_OPEN

ExtractionSource = Literal["answer_block", "boxed_fallback"]

# `\boxed` or `\fbox` not followed by another letter (so `\boxedx` is a different macro).
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# The argument of a brace-less `\boxed 5`: one token.
_BARE_TOKEN = re.compile(r"[^\s${}]+")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)


class Extraction(BaseModel):
    """What was found in one response."""

    model_config = ConfigDict(frozen=True)

    answer: str | None = Field(description="Content of the chosen box; None when none was found.")
    source: ExtractionSource | None = Field(description="Which rule produced the answer.")
    answer_blocks: int = Field(ge=0, description="Number of answer blocks in the response.")


def _brace_pairs(text: str) -> dict[int, int]:
    """Map each ``{`` of ``text`` that gets closed to the index just past its ``}``.

    One linear pass, so a response full of unclosed boxes cannot make extraction quadratic. A
    backslash escapes the next character: ``\\{`` is a literal brace, while ``\\\\{`` is a line
    break followed by a real one.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for token in _BRACE_TOKEN.finditer(text):
        char = token.group(0)
        if char == "{":
            stack.append(token.start())
        elif char == "}" and stack:
            pairs[stack.pop()] = token.end()
    return pairs


def find_boxed(text: str) -> list[str]:
    """Contents of every complete, non-empty ``\\boxed``/``\\fbox`` in ``text``, in order.

    Accepts ``\\boxed{x}``, ``\\boxed {x}`` and the brace-less ``\\boxed x`` (one token up
    to whitespace, ``$`` or a brace). Unclosed boxes (a truncated response) are skipped. A box
    nested in another is part of the outer box's content, not a separate entry.
    """
    contents: list[str] = []
    pairs: dict[int, int] | None = None
    position = 0
    while (match := _BOX_COMMAND.search(text, position)) is not None:
        i = match.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        position = match.end()
        if i < len(text) and text[i] == "{":
            pairs = _brace_pairs(text) if pairs is None else pairs
            close = pairs.get(i)
            if close is not None:
                contents.append(text[i + 1 : close - 1])
                position = close
        elif (token := _BARE_TOKEN.match(text, i)) is not None:
            contents.append(token.group(0))
            position = token.end()
    unwrapped = (_unwrap(content.strip()) for content in contents)
    return [content for content in unwrapped if content]


def _unwrap(content: str) -> str:
    """Strip boxes that wrap the whole content (``\\boxed{\\boxed{5}}`` is 5)."""
    while (match := _BOX_COMMAND.match(content)) is not None:
        brace = content.find("{", match.end())
        if brace < 0 or content[match.end() : brace].strip():
            break
        if _brace_pairs(content).get(brace) != len(content):
            break
        content = content[brace + 1 : -1].strip()
    return content


def answer_blocks(response: str) -> list[str]:
    """Contents of the answer blocks, in order.

    A final block left open counts as well: generation commonly stops on the closing answer tag
    as a stop string, which the engine then strips from the text.
    """
    blocks: list[str] = []
    position = 0
    while (start := response.find(ANSWER_OPEN, position)) >= 0:
        body_start = start + len(ANSWER_OPEN)
        end = response.find(ANSWER_CLOSE, body_start)
        if end < 0:
            blocks.append(response[body_start:])
            break
        blocks.append(response[body_start:end])
        position = end + len(ANSWER_CLOSE)
    return blocks


def extract_answer(response: str, *, boxed_fallback: bool = False) -> Extraction:
    """The final answer of ``response``.

    The last answer block is the final one; its last box is the answer. With
    ``boxed_fallback``, a response whose final block holds no box (or that has no block) falls
    back to the last box anywhere in the text.
    """
    blocks = answer_blocks(response)
    if blocks:
        boxes = find_boxed(blocks[-1])
        if boxes:
            return Extraction(answer=boxes[-1], source="answer_block", answer_blocks=len(blocks))
    if boxed_fallback:
        boxes = find_boxed(response)
        if boxes:
            return Extraction(answer=boxes[-1], source="boxed_fallback", answer_blocks=len(blocks))
    return Extraction(answer=None, source=None, answer_blocks=len(blocks))
