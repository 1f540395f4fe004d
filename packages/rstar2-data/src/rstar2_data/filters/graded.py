"""Filters from graded model answers (``GradedSample`` JSONL, as the evaluator writes it).

Label verification keeps a problem when enough samples agree with its label (the paper: 2 of
16 from a stronger model); the difficulty filter drops problems a policy always solved (the
paper's stage 3: 8 rollouts, drop 8/8).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rstar2_data.converters.base import RowKind
from rstar2_data.filters.base import Filter
from rstar2_data.filters.text import Item
from rstar2_data.jsonl import DataFileError, read_models
from rstar2_data.schemas import GradedSample


@dataclass(frozen=True)
class Tally:
    """Correct and total samples of one problem."""

    correct: int
    total: int


def tally_samples(
    samples: Iterable[GradedSample], *, origin: str = "graded samples"
) -> dict[str, Tally]:
    """Correct/total per problem id; a repeated (problem_id, sample_index) is an error.

    ``origin`` names where the samples came from in that error.
    """
    seen: set[tuple[str, int]] = set()
    counts: dict[str, list[int]] = {}
    for sample in samples:
        key = (sample.problem_id, sample.sample_index)
        if key in seen:
            raise DataFileError(
                origin, f"sample {sample.sample_index} of {sample.problem_id} repeats"
            )
        seen.add(key)
        pair = counts.setdefault(sample.problem_id, [0, 0])
        pair[0] += sample.correct
        pair[1] += 1
    return {pid: Tally(correct=c, total=t) for pid, (c, t) in counts.items()}


def load_tallies(paths: Iterable[Path]) -> dict[str, Tally]:
    """Tallies from one or more ``GradedSample`` JSONL files."""
    files = list(paths)
    samples: list[GradedSample] = []
    for path in files:
        samples.extend(read_models(path, GradedSample))
    return tally_samples(samples, origin=", ".join(str(path) for path in files))


class _Graded(Filter):
    kinds: ClassVar[tuple[RowKind, ...]] = ("math",)

    def __init__(self, tallies: dict[str, Tally], *, keep_ungraded: bool = False) -> None:
        self.tallies, self.keep_ungraded = tallies, keep_ungraded

    @abstractmethod
    def decide(self, tally: Tally) -> str | None:
        """The reason to remove a graded problem, or ``None`` to keep it."""

    def check(self, item: Item) -> str | None:
        tally = self.tallies.get(item.row.id)
        if tally is None:
            return None if self.keep_ungraded else "no graded samples"
        return self.decide(tally)


class LabelVerification(_Graded):
    """Keeps a problem when at least ``min_correct`` of its samples match its label."""

    name: ClassVar[str] = "label_verification"

    def __init__(
        self, tallies: dict[str, Tally], *, min_correct: int = 2, keep_ungraded: bool = False
    ) -> None:
        super().__init__(tallies, keep_ungraded=keep_ungraded)
        self.min_correct = min_correct

    def decide(self, tally: Tally) -> str | None:
        if tally.correct >= self.min_correct:
            return None
        return f"fewer than {self.min_correct} samples match the label"


class Difficulty(_Graded):
    """Drops problems solved by more than ``max_correct`` samples; by default, by all of them."""

    name: ClassVar[str] = "difficulty"

    def __init__(
        self,
        tallies: dict[str, Tally],
        *,
        max_correct: int | None = None,
        keep_ungraded: bool = False,
    ) -> None:
        super().__init__(tallies, keep_ungraded=keep_ungraded)
        self.max_correct = max_correct

    def decide(self, tally: Tally) -> str | None:
        if self.max_correct is None:
            return "solved by every sample" if tally.correct == tally.total else None
        return (
            f"solved more than {self.max_correct} times"
            if tally.correct > self.max_correct
            else None
        )
