"""Training rows from rstar2-data, and the seeded order in which a stage consumes them."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Literal, overload

from rstar2_data import (
    ChatExample,
    MathProblem,
    build,
    load_built,
    load_recipe,
)
from rstar2_data.rows import read_rows
from rstar2_train.config.schema import DataSource

logger = logging.getLogger(__name__)

RowKind = Literal["math", "chat"]


def _recipe_rows(source: DataSource, data_root: Path) -> list[Any]:
    """Build the recipe into ``data_root/<name>``; rstar2-data reuses each stage whose inputs
    (recipe entries, source files' content, package version) are unchanged, so an unchanged
    build costs only the sources' hashes and a changed source file is always rebuilt."""
    assert source.recipe is not None
    recipe = load_recipe(source.recipe, variables=source.vars)
    folder = data_root / recipe.name
    logger.info("building recipe %s into %s (unchanged stages are reused)", recipe.name, folder)
    build(recipe, folder, progress=False)
    return load_built(folder)


def _file_rows(path: Path, kind: RowKind) -> list[Any]:
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    try:
        return read_rows(path, kind=kind)
    except ValueError:
        other: RowKind = "chat" if kind == "math" else "math"
        try:
            read_rows(path, kind=other)
        except ValueError:
            raise  # not rows of either kind: the first error names the line and field
        wanted, found = _ROW_NAMES[kind], _ROW_NAMES[other]
        raise ValueError(f"{path} holds {found} rows; this stage needs {wanted} rows") from None


_ROW_NAMES: dict[RowKind, str] = {"math": "MathProblem", "chat": "ChatExample"}


@overload
def load_rows(source: DataSource, kind: Literal["math"], data_root: Path) -> list[MathProblem]: ...
@overload
def load_rows(source: DataSource, kind: Literal["chat"], data_root: Path) -> list[ChatExample]: ...
def load_rows(source: DataSource, kind: RowKind, data_root: Path) -> list[Any]:
    """The rows of ``source`` (``kind``: MathProblem or ChatExample), first ``limit`` only."""
    if source.file is not None:
        rows = _file_rows(Path(source.file), kind)
    elif source.build is not None:
        rows = load_built(Path(source.build))
    else:
        rows = _recipe_rows(source, data_root)
    expected = MathProblem if kind == "math" else ChatExample
    if rows and not isinstance(rows[0], expected):
        raise ValueError(
            f"data source {source.model_dump(exclude_defaults=True)} holds "
            f"{type(rows[0]).__name__} rows; this stage needs {_ROW_NAMES[kind]} rows"
        )
    if not rows:
        raise ValueError(f"data source {source.model_dump(exclude_defaults=True)} has no rows")
    return rows[: source.limit] if source.limit is not None else rows


class DataOrder:
    """Indices of ``size`` rows, epoch after epoch, each epoch a seeded permutation.

    The position is its whole state (epoch, offset), so a resumed stage continues with exactly
    the rows an uninterrupted one would have taken.
    """

    def __init__(self, size: int, *, seed: int, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError("DataOrder needs at least one row")
        self.size = size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, count: int) -> list[int]:
        """The next ``count`` indices, running into the next epoch when this one ends."""
        out: list[int] = []
        while len(out) < count:
            if self.offset == self.size:
                self.epoch += 1
                self.offset = 0
                self._order = self._permutation(self.epoch)
            step = min(count - len(out), self.size - self.offset)
            out.extend(self._order[self.offset : self.offset + step])
            self.offset += step
        return out

    @property
    def consumed(self) -> int:
        """Rows taken so far, over all epochs."""
        return self.epoch * self.size + self.offset

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "size": self.size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["size"] != self.size:
            raise ValueError(
                f"the checkpoint's data had {state['size']} rows, this data has {self.size}: "
                "resume with the same data"
            )
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._order = self._permutation(self.epoch)
