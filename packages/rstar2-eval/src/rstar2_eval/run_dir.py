"""An evaluation's output directory: ``run.json``, the generations file, resume and locking.

``generations.jsonl`` is appended one line per finished rollout (one ``write`` each, so a kill
leaves at most one partial last line, which resuming drops with a warning). ``run.json`` holds
the run's ``RunSpec``: what decides which samples exist and what they are. Resuming requires the
same spec, so a resumed run adds exactly the samples an uninterrupted one would have.
"""

from __future__ import annotations

import fcntl
import logging
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rstar2_data.jsonl import atomic_write_text
from rstar2_eval.diversity import SampleDiversity
from rstar2_eval.errors import InputError
from rstar2_eval.generations import Generation, NumberedGeneration, read_generations
from rstar2_eval.problem_sets import ProblemSet, ProblemSource
from rstar2_eval.settings import EvalSettings
from rstar2_eval.verification import AnswerFormat
from rstar2_scheduler.protocol import ChatConfig

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
GENERATIONS_FILE = "generations.jsonl"
_LOCK_FILE = ".lock"
_VERSIONED = (
    "rstar2-eval",
    "rstar2-scheduler",
    "rstar2-data",
    "rstar2-sandbox",
    "math-verify",
    "torch",
    "transformers",
    "vllm",
)

TemplateSource = Literal["checkpoint", "rstar2"]
"""Which chat template rendered the prompts: the one the checkpoint ships, or rstar2's."""


class ModelInfo(BaseModel):
    """What generated the samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["checkpoint", "endpoint", "engines"] = Field(
        description="A checkpoint run in-process, an OpenAI-compatible server, or engines a "
        "caller passed in (e.g. a trainer's policy)."
    )
    name: str = Field(description="Checkpoint path or hub id, served model name, or a label.")
    revision: str | None = Field(default=None, description="E.g. the training step.")
    weights_sha256: str | None = Field(
        default=None, description="Hash of the checkpoint's weight files (checkpoints only)."
    )
    weights_bytes: int | None = None


class ProblemSetRecord(BaseModel):
    """A problem set as recorded in ``run.json`` (without its problems)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: ProblemSource
    title: str
    answer_format: AnswerFormat
    problems: int
    sha256: str

    @classmethod
    def of(cls, problem_set: ProblemSet) -> ProblemSetRecord:
        return cls(
            source=problem_set.source,
            title=problem_set.title,
            answer_format=problem_set.answer_format,
            problems=len(problem_set.problems),
            sha256=problem_set.sha256(),
        )


class RunSpec(BaseModel):
    """Everything that decides which samples a run has and how they are drawn."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelInfo
    chat: ChatConfig
    chat_template: TemplateSource
    template_sha256: str
    problem_sets: list[ProblemSetRecord]
    settings: EvalSettings


class RolloutCounts(BaseModel):
    """Where a run's samples came from."""

    model_config = ConfigDict(extra="forbid")

    planned: int = Field(description="Samples in the selection: problems x samples.")
    resumed: int = Field(description="Already in the output directory when the call started.")
    generated: int = Field(description="Finished during the call.")
    failed: int = Field(description="Ended by an engine error: not written, drawn again on resume.")


class RunRecord(BaseModel):
    """``run.json``."""

    model_config = ConfigDict(extra="forbid")

    spec: RunSpec
    status: Literal["running", "complete", "incomplete"] = "running"
    options: dict[str, Any] | None = Field(
        default=None, description="The command line's options (``rstar2-eval run``)."
    )
    execution: dict[str, Any] = Field(
        default_factory=dict, description="Engines, sandbox and grader of the latest call."
    )
    versions: dict[str, str] = Field(default_factory=dict)
    created_at: str
    updated_at: str
    rollouts: RolloutCounts | None = None
    elapsed_s: float | None = Field(default=None, description="Of the latest call.")
    sample_diversity: SampleDiversity | None = Field(
        default=None, description="Whether the samples of each problem differ (latest call)."
    )

    @classmethod
    def load(cls, out_dir: Path) -> RunRecord:
        path = out_dir / RUN_FILE
        try:
            return cls.model_validate_json(path.read_bytes())
        except OSError as error:
            raise InputError(str(path), f"cannot read: {error.strerror}") from None
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or None
            raise InputError(str(path), first["msg"], field=field) from None


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that shape a run's results."""
    found: dict[str, str] = {}
    for name in _VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}{key}."))
        return flat
    if isinstance(value, list):
        flat = {}
        for index, item in enumerate(value):
            flat.update(_flatten(item, f"{prefix}{index}."))
        return flat
    return {prefix.rstrip("."): value}


def spec_differences(stored: RunSpec, current: RunSpec) -> list[str]:
    """Human-readable differences between two specs, e.g. ``settings.temperature: 0.6 -> 1.0``."""
    old, new = _flatten(stored.model_dump(mode="json")), _flatten(current.model_dump(mode="json"))
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def recover_generations(path: Path) -> list[NumberedGeneration]:
    """The finished generations in ``path``; an incomplete last line (a kill mid-write) is cut
    off the file with a warning, and its sample is generated again."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        logger.warning(
            "%s: dropping an incomplete last line (%d bytes) left by an interrupted run; "
            "that sample is generated again",
            path,
            len(data) - end,
        )
        with path.open("r+b") as handle:
            handle.truncate(end)
    if not data[:end].strip():
        return []
    return read_generations(path)


class RunDirectory:
    """An output directory opened for one call: locked, spec checked, generations appendable."""

    def __init__(self, out_dir: Path, record: RunRecord, existing: list[NumberedGeneration]):
        self.path = out_dir
        self.record = record
        self.existing = existing
        self._lock: BinaryIO | None = None
        self._generations: BinaryIO | None = None

    @classmethod
    def open(
        cls,
        out_dir: Path,
        spec: RunSpec,
        *,
        options: dict[str, Any] | None = None,
        execution: dict[str, Any] | None = None,
    ) -> RunDirectory:
        """Start a run in ``out_dir``, or resume the one there; InputError when the directory
        holds a run with another spec or another process is writing it."""
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = (out_dir / _LOCK_FILE).open("wb")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise InputError(
                str(out_dir), "another rstar2-eval run is writing to this directory"
            ) from None
        try:
            directory = cls._prepare(out_dir, spec, options, execution or {})
        except BaseException:
            lock.close()
            raise
        directory._lock = lock
        directory._generations = (out_dir / GENERATIONS_FILE).open("ab", buffering=0)
        return directory

    @classmethod
    def _prepare(
        cls,
        out_dir: Path,
        spec: RunSpec,
        options: dict[str, Any] | None,
        execution: dict[str, Any],
    ) -> RunDirectory:
        generations = out_dir / GENERATIONS_FILE
        if (out_dir / RUN_FILE).exists():
            record = RunRecord.load(out_dir)
            differences = spec_differences(record.spec, spec)
            if differences:
                shown = "; ".join(differences[:6])
                more = f" (and {len(differences) - 6} more)" if len(differences) > 6 else ""
                raise InputError(
                    str(out_dir / RUN_FILE),
                    f"this directory holds a run with other settings: {shown}{more}. Resume it "
                    "with its own settings (`resume`) or use another output directory",
                )
            record = record.model_copy(
                update={"options": options if options is not None else record.options}
            )
        elif generations.exists() and generations.stat().st_size:
            raise InputError(
                str(generations), f"exists without {RUN_FILE}: not an rstar2-eval run directory"
            )
        else:
            now = _now()
            record = RunRecord(spec=spec, options=options, created_at=now, updated_at=now)
        record = record.model_copy(
            update={
                "status": "running",
                "execution": execution,
                "versions": package_versions(),
                "updated_at": _now(),
            }
        )
        atomic_write_text(out_dir / RUN_FILE, record.model_dump_json(indent=2) + "\n")
        return cls(out_dir, record, recover_generations(generations))

    def append(self, generation: Generation) -> None:
        """Add one finished sample (one write: a kill leaves at most a partial last line)."""
        assert self._generations is not None, "RunDirectory is closed"
        self._generations.write(generation.model_dump_json(exclude_none=True).encode() + b"\n")

    def finish(
        self, rollouts: RolloutCounts, elapsed_s: float, diversity: SampleDiversity | None = None
    ) -> None:
        """Record how the call ended in ``run.json``."""
        complete = rollouts.resumed + rollouts.generated == rollouts.planned
        self.record = self.record.model_copy(
            update={
                "status": "complete" if complete else "incomplete",
                "rollouts": rollouts,
                "elapsed_s": elapsed_s,
                "sample_diversity": diversity,
                "updated_at": _now(),
            }
        )
        atomic_write_text(self.path / RUN_FILE, self.record.model_dump_json(indent=2) + "\n")

    def close(self) -> None:
        for handle in (self._generations, self._lock):
            if handle is not None:
                handle.close()
        self._generations = self._lock = None

    @property
    def generations_path(self) -> Path:
        return self.path / GENERATIONS_FILE
