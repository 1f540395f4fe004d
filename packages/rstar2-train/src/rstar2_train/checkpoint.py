"""Checkpoints: Hugging Face weights and tokenizer, plus everything needed to resume exactly.

A checkpoint folder is written under a temporary name and renamed into place, so a folder named
``step-N`` is always complete: a run killed while saving leaves only a temporary folder, which
the next save removes. The weights load with ``from_pretrained`` (transformers, vLLM,
``rstar2-eval run --model``) without rstar2.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rstar2_data.protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TURN_END, TURN_START

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class TrainerState(BaseModel):
    """Where a stage stands: the step just finished and the data position after it."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    kind: str
    step: int = Field(ge=0)
    total_steps: int = Field(ge=0)
    data: dict[str, int] = Field(description="DataOrder state after this step.")
    finished: bool = False


def rng_state() -> dict[str, Any]:
    """Every random generator the trainer may touch."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_PROBE = (
    f"{TURN_START}user\nWhat is 12345 * 678?\n"
    f'{TOOL_CALL_OPEN}{{"code": "print(1)"}}{TOOL_CALL_CLOSE}{TURN_END}'
)


def check_tokenizer_reloads(tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Fail when ``AutoTokenizer`` would load the saved tokenizer differently from the one
    trained with: some model types make transformers impose their own pre-tokenizer, and the
    checkpoint would then be silently wrong for every user that loads it."""
    reloaded = AutoTokenizer.from_pretrained(folder)
    ours = tokenizer.encode(_PROBE, add_special_tokens=False)
    theirs = reloaded.encode(_PROBE, add_special_tokens=False)
    if ours != theirs:
        raise RuntimeError(
            f"AutoTokenizer loads the tokenizer saved in {folder} as "
            f"{type(reloaded).__name__}, which encodes differently from the tokenizer the model "
            "was trained with (transformers imposes its own pre-tokenizer for this model type); "
            "use another architecture for a model with a trained tokenizer (e.g. Qwen3ForCausalLM)"
        )


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())


def save_checkpoint(
    folder: Path,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer_state: dict[str, Any] | None,
    state: TrainerState,
) -> Path:
    """Write a complete checkpoint to ``folder`` atomically (replacing one that is there)."""
    temporary = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    model.save_pretrained(temporary, safe_serialization=True)
    tokenizer.save_pretrained(temporary)
    check_tokenizer_reloads(tokenizer, temporary)
    if optimizer_state is not None:
        torch.save(optimizer_state, temporary / OPTIMIZER_FILE)
    torch.save(rng_state(), temporary / RNG_FILE)
    (temporary / STATE_FILE).write_text(state.model_dump_json(indent=2) + "\n")
    _fsync_tree(temporary)
    if folder.exists():
        retired = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(retired, ignore_errors=True)
        folder.rename(retired)
        temporary.rename(folder)
        shutil.rmtree(retired)
    else:
        temporary.rename(folder)
    return folder


def read_state(folder: Path) -> TrainerState:
    return TrainerState.model_validate(json.loads((folder / STATE_FILE).read_text()))


def load_optimizer_state(folder: Path) -> dict[str, Any]:
    path = folder / OPTIMIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds no optimizer state ({OPTIMIZER_FILE})")
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return state


def load_rng(folder: Path) -> None:
    restore_rng(torch.load(folder / RNG_FILE, weights_only=False))


def step_folder(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete step checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [
        (int(match.group(1)), path)
        for path in root.iterdir()
        if (match := _STEP_DIR.match(path.name)) and (path / STATE_FILE).is_file()
    ]
    return [path for _, path in sorted(found)]


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints (and leftovers of killed saves)."""
    for path in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(path)
        logger.info("deleted old checkpoint %s", path)
    for leftover in root.glob(".step-*"):
        shutil.rmtree(leftover, ignore_errors=True)
