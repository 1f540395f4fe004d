"""``evaluate``: multi-turn tool rollouts of problem sets on running engines, graded as they end.

The one code path of ``rstar2-eval run`` and of a trainer's periodic validation. It never starts
or closes what it is given (engines, sandbox, grader): a trainer passes the engines that hold its
policy and keeps using them afterwards.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from transformers import PreTrainedTokenizerBase

from rstar2_data.schemas import MathProblem
from rstar2_eval.diversity import SampleDiversity, check_diversity
from rstar2_eval.errors import InputError
from rstar2_eval.generations import Generation
from rstar2_eval.grading import AsyncGrader
from rstar2_eval.problem_sets import ProblemSet
from rstar2_eval.progress import LiveProgress
from rstar2_eval.reports import write_problems_csv, write_report_json
from rstar2_eval.run_dir import (
    ModelInfo,
    ProblemSetRecord,
    RolloutCounts,
    RunDirectory,
    RunSpec,
    TemplateSource,
)
from rstar2_eval.scoring import (
    BenchmarkScore,
    ScoredSample,
    ScoreReport,
    ScoreResult,
    aggregate_scores,
)
from rstar2_eval.settings import EvalSettings, sample_seed
from rstar2_sandbox.protocol import Sandbox
from rstar2_scheduler import (
    ChatConfig,
    Engine,
    JobResult,
    RolloutJob,
    RolloutRunner,
    RolloutScheduler,
    SchedulerConfig,
    Trajectory,
)
from rstar2_scheduler.protocol import CHAT_TEMPLATE

logger = logging.getLogger(__name__)

REPORT_STEM = "generations"
"""Report files are named after the generations file, as ``rstar2-eval score`` names them."""


class EvalReport(BaseModel):
    """What an evaluation found: per-benchmark scores, and how the samples were drawn."""

    model_config = ConfigDict(extra="forbid")

    model: ModelInfo
    settings: EvalSettings
    chat_template: TemplateSource
    template_matches_rstar2: bool = Field(
        description="The template in use is rstar2's own (the trainer's), character for character."
    )
    score: ScoreReport = Field(description="Per-benchmark metrics, as rstar2-eval score reports.")
    rollouts: RolloutCounts
    sample_diversity: SampleDiversity = Field(
        description="Whether the samples of each problem differ; collapsed: they did not."
    )
    elapsed_s: float = Field(description="Wall time of this call.")
    out_dir: str | None = None

    def benchmark(self, name: str) -> BenchmarkScore:
        """The scores of one problem set."""
        for score in self.score.benchmarks:
            if score.benchmark == name:
                return score
        known = ", ".join(s.benchmark for s in self.score.benchmarks)
        raise KeyError(f"no scores for {name!r}; the report has {known}")

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat ``{"<prefix><set>/avg@k": value, ...}`` for a metrics logger."""
        flat: dict[str, float] = {}
        for score in self.score.benchmarks:
            head = f"{prefix}{score.benchmark}/"
            flat[f"{head}avg@{score.min_samples}"] = score.avg
            flat.update({f"{head}pass@{k}": v for k, v in score.pass_at_k.items()})
            flat.update({f"{head}maj@{k}": v for k, v in score.maj_at_k.items()})
            optional = {
                "response_tokens": score.mean_response_tokens,
                "tool_calls_per_rollout": score.tool_calls_per_response,
                "tool_error_ratio": score.tool_error_ratio,
                "truncation_rate": score.truncation_rate,
            }
            flat.update({head + key: v for key, v in optional.items() if v is not None})
        return flat


def to_generation(benchmark: str, sample_index: int, trajectory: Trajectory) -> Generation:
    """The generations-file line of one finished rollout."""
    quality = trajectory.quality
    return Generation(
        benchmark=benchmark,
        problem_id=trajectory.problem_id,
        sample_index=sample_index,
        response=trajectory.response_text,
        response_tokens=trajectory.response_tokens,
        tool_calls=quality.tool_calls,
        tool_errors=quality.failed_tool_calls,
        truncated=quality.truncated,
    )


@dataclass(frozen=True)
class _Sample:
    problem_set: ProblemSet
    problem: MathProblem
    index: int


class _StreamingGrader:
    """Grades samples as they arrive, in batches (everything queued since the last one),
    through the grader's ``agrade_many``, so the event loop keeps driving rollouts."""

    def __init__(
        self, grader: AsyncGrader, sets: Mapping[str, ProblemSet], progress: LiveProgress
    ) -> None:
        self.grader = grader
        self.golds = {
            name: {p.id: p.answer for p in problem_set.problems}
            for name, problem_set in sets.items()
        }
        self.formats = {name: problem_set.answer_format for name, problem_set in sets.items()}
        self.progress = progress
        self.samples: list[ScoredSample] = []
        self._queue: asyncio.Queue[Generation | None] = asyncio.Queue()

    def submit(self, generation: Generation) -> None:
        self._queue.put_nowait(generation)

    def close(self) -> None:
        self._queue.put_nowait(None)

    async def run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            generations = [item for item in batch if item is not None]
            if generations:
                await self._grade(generations)
            if None in batch:
                return

    async def _grade(self, generations: list[Generation]) -> None:
        grades = await self.grader.agrade_many(
            [g.response for g in generations],
            [self.golds[g.benchmark][g.problem_id] for g in generations],
            answer_format=[self.formats[g.benchmark] for g in generations],
        )
        for generation, grade in zip(generations, grades, strict=True):
            self.samples.append(ScoredSample(generation=generation, grade=grade))
            self.progress.graded(generation.benchmark, grade.correct)


def _check_sets(problem_sets: Sequence[ProblemSet]) -> dict[str, ProblemSet]:
    sets: dict[str, ProblemSet] = {}
    for problem_set in problem_sets:
        if problem_set.name in sets:
            raise InputError("problem sets", f"{problem_set.name!r} appears twice")
        sets[problem_set.name] = problem_set
    if not sets:
        raise InputError("problem sets", "expected at least one problem set")
    return sets


def _resumed(
    directory: RunDirectory | None, sets: Mapping[str, ProblemSet], samples: int
) -> list[Generation]:
    if directory is None:
        return []
    origin = str(directory.generations_path)
    ids = {name: {p.id for p in problem_set.problems} for name, problem_set in sets.items()}
    for numbered in directory.existing:
        generation = numbered.generation
        if (
            generation.problem_id not in ids.get(generation.benchmark, set())
            or generation.sample_index >= samples
        ):
            raise InputError(
                origin,
                f"sample {generation.sample_index} of {generation.benchmark}/"
                f"{generation.problem_id} is not part of this run",
                line=numbered.line,
            )
    return [numbered.generation for numbered in directory.existing]


async def evaluate(
    engines: Sequence[Engine],
    tokenizer: PreTrainedTokenizerBase,
    sandbox: Sandbox,
    grader: AsyncGrader,
    problem_sets: Sequence[ProblemSet],
    settings: EvalSettings | None = None,
    *,
    chat: ChatConfig | None = None,
    model: ModelInfo | None = None,
    out_dir: Path | None = None,
    scheduler: SchedulerConfig | None = None,
    progress: bool = False,
    console: Console | None = None,
    plot: bool = True,
    options: dict[str, Any] | None = None,
    execution: dict[str, Any] | None = None,
    allow_identical_samples: bool = False,
) -> EvalReport:
    """Roll out every problem of ``problem_sets`` ``settings.samples`` times and score them.

    Rollouts are placed on ``engines`` by the scheduler's kv-aware policy (engines are started
    if needed, never closed), run their tool calls in ``sandbox`` and are graded by ``grader``
    as they finish (an ``AsyncGrader``: a ``Grader``, or any object with its ``config`` and
    ``agrade_many``, such as a trainer's grader actors). Sample ``i`` of a problem is seeded
    from ``(settings.seed, set name, problem id, i)`` alone.

    With ``out_dir``, finished samples go to ``out_dir/generations.jsonl`` as they end (the
    input format of ``rstar2-eval score``), the report to ``generations.report.json``,
    ``generations.problems.csv`` and (``plot``) ``generations.scores.png``, and the settings to
    ``run.json``. A directory that already holds this run is resumed: finished samples are
    kept and graded again, the others generated. ``model`` labels what the engines run
    (default: ``engines``); ``options`` and ``execution`` are recorded in ``run.json``.

    When k > 1 at temperature > 0 and the samples of (nearly) every problem are identical, a
    warning naming the likely cause goes to the log, ``run.json`` and
    ``EvalReport.sample_diversity`` (``allow_identical_samples`` records that it is accepted).
    """
    started = time.perf_counter()
    settings = settings if settings is not None else EvalSettings()
    chat = chat if chat is not None else ChatConfig()
    model = model if model is not None else ModelInfo(kind="engines", name="engines")
    sets = {name: s.head(settings.limit) for name, s in _check_sets(problem_sets).items()}
    runner = RolloutRunner(
        tokenizer, sandbox, settings.rollout_config(chat), tools=settings.tools()
    )
    template = runner.chat.template
    spec = RunSpec(
        model=model,
        chat=chat,
        chat_template="checkpoint" if chat.use_checkpoint_template else "rstar2",
        template_sha256=hashlib.sha256(template.encode()).hexdigest(),
        problem_sets=[ProblemSetRecord.of(s) for s in sets.values()],
        settings=settings,
    )
    directory = (
        RunDirectory.open(out_dir, spec, options=options, execution=execution)
        if out_dir is not None
        else None
    )
    try:
        resumed = _resumed(directory, sets, settings.samples)
        done = {(g.benchmark, g.problem_id, g.sample_index) for g in resumed}
        todo = [
            _Sample(problem_set, problem, index)
            for problem_set in sets.values()
            for problem in problem_set.problems
            for index in range(settings.samples)
            if (problem_set.name, problem.id, index) not in done
        ]
        totals = [(name, len(s.problems) * settings.samples) for name, s in sets.items()]
        with LiveProgress(totals, bar=progress, console=console) as live:
            for name in sets:
                live.resumed(name, sum(g.benchmark == name for g in resumed))
            counts, samples = await _roll_out(
                engines, runner, grader, sets, settings, todo, resumed, directory, scheduler, live
            )
        result = aggregate_scores(
            samples,
            sets,
            origin=str(directory.generations_path) if directory is not None else "(memory)",
            boxed_fallback=grader.config.boxed_fallback,
            timeout_s=grader.config.timeout_s,
        )
        diversity = check_diversity(samples, settings, engines, accepted=allow_identical_samples)
        if diversity.collapsed:
            logger.warning(
                "%s%s",
                diversity.message(),
                " (accepted: --allow-identical-samples)" if diversity.accepted else "",
            )
        elapsed = time.perf_counter() - started
        if directory is not None:
            _write_reports(directory, result, plot)
            directory.finish(counts, elapsed, diversity)
    finally:
        if directory is not None:
            directory.close()
    if counts.failed:
        logger.warning(
            "%d of %d rollouts failed (engine errors) and are missing from the scores%s",
            counts.failed,
            counts.planned,
            "; run again with the same --out to retry them" if directory is not None else "",
        )
    return EvalReport(
        model=model,
        settings=settings,
        chat_template=spec.chat_template,
        template_matches_rstar2=template == CHAT_TEMPLATE,
        score=result.report,
        rollouts=counts,
        sample_diversity=diversity,
        elapsed_s=elapsed,
        out_dir=str(out_dir) if out_dir is not None else None,
    )


async def _roll_out(
    engines: Sequence[Engine],
    runner: RolloutRunner,
    grader: AsyncGrader,
    sets: Mapping[str, ProblemSet],
    settings: EvalSettings,
    todo: Sequence[_Sample],
    resumed: Sequence[Generation],
    directory: RunDirectory | None,
    scheduler: SchedulerConfig | None,
    live: LiveProgress,
) -> tuple[RolloutCounts, list[ScoredSample]]:
    """Run the rollouts of ``todo``, writing and grading each as it ends."""
    grading = _StreamingGrader(grader, sets, live)
    for generation in resumed:
        grading.submit(generation)
    grading_task = asyncio.create_task(grading.run(), name="rstar2-eval-grading")
    counts = RolloutCounts(
        planned=sum(len(s.problems) for s in sets.values()) * settings.samples,
        resumed=len(resumed),
        generated=0,
        failed=0,
    )
    # A problem's KV reservation (prompt + budget) is the same for all its samples.
    reservations: dict[tuple[str, str], int] = {}
    jobs: list[RolloutJob[Trajectory]] = []
    for sample in todo:
        key = (sample.problem_set.name, sample.problem.id)
        if key not in reservations:
            reservations[key] = runner.max_tokens(sample.problem)
        jobs.append(_job(runner, sample, settings.seed, reservations[key]))

    def on_result(result: JobResult[Trajectory]) -> None:
        sample = todo[result.index]
        name = sample.problem_set.name
        trajectory = result.value
        error = result.error
        if trajectory is not None and trajectory.stop_reason == "engine_error":
            error = f"engine {trajectory.engine}: {trajectory.error}"
        if error is not None or trajectory is None:
            counts.failed += 1
            if counts.failed <= 5:
                logger.warning(
                    "%s/%s sample %d failed: %s", name, sample.problem.id, sample.index, error
                )
            live.finished(name, failed=True)
            return
        generation = to_generation(name, sample.index, trajectory)
        if directory is not None:
            directory.append(generation)
        counts.generated += 1
        live.finished(name)
        grading.submit(generation)

    try:
        if jobs:
            rollouts = RolloutScheduler(engines, scheduler)
            # run() starts the engines (idempotent); the caller owns and closes them.
            await rollouts.run(jobs, on_result=on_result)
        grading.close()
        await grading_task
    finally:
        if not grading_task.done():
            grading_task.cancel()
    return counts, grading.samples


def _job(
    runner: RolloutRunner, sample: _Sample, seed: int, kv_tokens: int
) -> RolloutJob[Trajectory]:
    name, problem, index = sample.problem_set.name, sample.problem, sample.index

    async def run(engine: Engine) -> Trajectory:
        return await runner.rollout(
            problem,
            engine,
            rollout_id=f"{name}/{problem.id}/{index}",
            seed=sample_seed(seed, name, problem.id, index),
        )

    return RolloutJob(run=run, kv_tokens=kv_tokens, key=f"{name}/{problem.id}/{index}")


def _write_reports(directory: RunDirectory, result: ScoreResult, plot: bool) -> None:
    report_path = directory.path / f"{REPORT_STEM}.report.json"
    write_report_json(result.report, report_path)
    write_problems_csv(result.problems, directory.path / f"{REPORT_STEM}.problems.csv")
    if plot:
        from rstar2_eval.plotting import plot_scores

        try:
            plot_scores(result.report, directory.path / f"{REPORT_STEM}.scores.png")
        except RuntimeError as missing:  # matplotlib is an optional extra
            logger.warning("no PNG: %s", missing)
