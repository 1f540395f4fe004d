"""Scoring a generations file: grade every sample, then aggregate per problem and benchmark."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from rstar2_data.answers import canonical_integer
from rstar2_data.schemas import GradedSample, MathProblem
from rstar2_eval.errors import InputError
from rstar2_eval.generations import Generation, NumberedGeneration
from rstar2_eval.grading import Grade, Grader, GradeStatus, ProgressCallback
from rstar2_eval.instruction_tasks import InstructionScores, instruction_scores
from rstar2_eval.metrics import majority_vote, mean_accuracy, pass_at_k
from rstar2_eval.problem_sets import ProblemSet, ProblemSource
from rstar2_eval.registry import get_benchmark

if TYPE_CHECKING:
    from rstar2_eval.code_grading import SandboxedGrading

logger = logging.getLogger(__name__)

# Every correct answer equals the gold, hence each other: they vote as one.
_CORRECT_VOTE = "\x00correct"


class StatusCounts(BaseModel):
    """How many samples ended in each grade status."""

    correct: int = 0
    incorrect: int = 0
    no_answer: int = 0
    timeout: int = 0
    ungradable: int = 0


class ProblemScore(BaseModel):
    """One problem's samples, summarized (a row of the per-problem CSV)."""

    benchmark: str
    problem_id: str
    gold: str
    samples: int
    correct: int
    accuracy: float = Field(description="correct / samples")
    pass_at_k: dict[int, float]
    majority_answer: str | None = Field(description="Most voted answer over all samples.")
    majority_correct: bool
    no_answer: int
    timeouts: int


class BenchmarkScore(BaseModel):
    """Metrics of one benchmark."""

    benchmark: str
    title: str
    problems: int = Field(description="Problems with at least one sample.")
    problems_in_benchmark: int
    missing_problems: list[str] = Field(description="Benchmark problems with no sample.")
    samples: int
    min_samples: int
    max_samples: int
    avg: float = Field(description="avg@k: mean over problems of correct/samples (avg pass@1).")
    pass_at_k: dict[int, float] = Field(description="Unbiased pass@k, mean over problems.")
    maj_at_k: dict[int, float] = Field(description="Majority vote over the first k samples.")
    statuses: StatusCounts
    boxed_fallback_used: int = Field(description="Answers found only by the \\boxed{} fallback.")
    boxed_fallback_correct: int = Field(description="Of those, how many were correct.")
    multiple_answer_blocks: int = Field(description="Responses with more than one answer block.")
    mean_response_tokens: float | None
    tool_calls_per_response: float | None
    tool_error_ratio: float | None = Field(description="Failed tool calls / tool calls.")
    truncation_rate: float | None
    identical_samples: int = Field(
        description="Problems with several samples whose responses are all the same text (at "
        "temperature > 0 a sign that the engine decoded greedily)."
    )
    instruction_following: InstructionScores | None = Field(
        default=None, description="IFEval sets: strict and loose prompt/instruction accuracy."
    )


class ScoreReport(BaseModel):
    """The JSON report of ``rstar2-eval score``."""

    model_config = ConfigDict(extra="forbid")

    generations: str
    boxed_fallback: bool
    timeout_s: float
    benchmarks: list[BenchmarkScore]


class ScoredSample(BaseModel):
    """One generation with its grade."""

    model_config = ConfigDict(frozen=True)

    generation: Generation
    grade: Grade

    def to_graded_sample(self) -> GradedSample:
        """The row format the data filters (label verification, difficulty) read."""
        return GradedSample(
            problem_id=self.generation.problem_id,
            sample_index=self.generation.sample_index,
            answer=self.grade.answer,
            correct=self.grade.correct,
            benchmark=self.generation.benchmark,
        )


class ScoreResult(BaseModel):
    """Everything ``score`` produces, before it is written anywhere."""

    report: ScoreReport
    problems: list[ProblemScore]
    samples: list[ScoredSample]


def default_ks(n: int) -> list[int]:
    """Powers of two up to ``n``, and ``n`` itself."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    return ks if ks[-1] == n else [*ks, n]


def _vote(grade: Grade) -> str | None:
    if grade.answer is None or grade.status == "no_answer":
        return None
    if grade.correct:
        return _CORRECT_VOTE
    integer = canonical_integer(grade.answer)
    return integer if integer is not None else "".join(grade.answer.split())


def _mean(values: Sequence[float]) -> float | None:
    return fmean(values) if values else None


def _score_problem(
    problem: MathProblem, benchmark: str, samples: list[ScoredSample]
) -> ProblemScore:
    grades = [sample.grade for sample in samples]
    n, c = len(grades), sum(grade.correct for grade in grades)
    winner, _ = majority_vote([_vote(grade) for grade in grades])
    representative = next(
        (g.answer for g in grades if winner is not None and _vote(g) == winner), None
    )
    return ProblemScore(
        benchmark=benchmark,
        problem_id=problem.id,
        gold=problem.answer,
        samples=n,
        correct=c,
        accuracy=c / n,
        pass_at_k={k: pass_at_k(n, c, k) for k in default_ks(n)},
        majority_answer=representative,
        majority_correct=winner == _CORRECT_VOTE,
        no_answer=sum(grade.status == "no_answer" for grade in grades),
        timeouts=sum(grade.status == "timeout" for grade in grades),
    )


def _score_benchmark(
    problem_set: ProblemSet,
    by_problem: Mapping[str, list[ScoredSample]],
    ks: Sequence[int] | None,
) -> BenchmarkScore:
    name, problems = problem_set.name, problem_set.problems
    scored = [p for p in problems if p.id in by_problem]
    groups = [by_problem[p.id] for p in scored]
    counts = [len(group) for group in groups]
    correct = [sum(s.grade.correct for s in group) for group in groups]
    n_min = min(counts)
    wanted = list(ks) if ks is not None else default_ks(n_min)
    usable = [k for k in wanted if 1 <= k <= n_min]
    if len(usable) < len(wanted):
        logger.warning(
            "%s: k values %s exceed the %d samples of some problem; left out",
            name,
            sorted(set(wanted) - set(usable)),
            n_min,
        )
    samples = [s for group in groups for s in group]
    grades = [s.grade for s in samples]
    gens = [s.generation for s in samples]
    statuses: Counter[GradeStatus] = Counter(grade.status for grade in grades)
    fallback = [grade for grade in grades if grade.source == "boxed_fallback"]
    calls = [g for g in gens if g.tool_calls is not None and g.tool_errors is not None]
    total_calls = sum(g.tool_calls or 0 for g in calls)
    return BenchmarkScore(
        benchmark=name,
        title=problem_set.title,
        problems=len(scored),
        problems_in_benchmark=len(problems),
        missing_problems=[p.id for p in problems if p.id not in by_problem],
        samples=len(samples),
        min_samples=n_min,
        max_samples=max(counts),
        avg=mean_accuracy(correct, counts),
        pass_at_k={
            k: fmean(pass_at_k(n, c, k) for n, c in zip(counts, correct, strict=True))
            for k in usable
        },
        maj_at_k={
            k: fmean(
                majority_vote([_vote(s.grade) for s in group[:k]])[0] == _CORRECT_VOTE
                for group in groups
            )
            for k in usable
        },
        statuses=StatusCounts.model_validate(dict(statuses)),
        boxed_fallback_used=len(fallback),
        boxed_fallback_correct=sum(grade.correct for grade in fallback),
        multiple_answer_blocks=sum((g.answer_blocks or 0) > 1 for g in grades),
        mean_response_tokens=_mean(
            [g.response_tokens for g in gens if g.response_tokens is not None]
        ),
        tool_calls_per_response=_mean([g.tool_calls for g in gens if g.tool_calls is not None]),
        tool_error_ratio=(
            sum(g.tool_errors or 0 for g in calls) / total_calls if total_calls else None
        ),
        truncation_rate=_mean([float(g.truncated) for g in gens if g.truncated is not None]),
        identical_samples=sum(
            len(group) > 1 and len({s.generation.response for s in group}) == 1 for group in groups
        ),
        instruction_following=instruction_scores(grades),
    )


def _gold_of(
    numbered: NumberedGeneration, index: Mapping[str, Mapping[str, MathProblem]], origin: str
) -> str:
    generation = numbered.generation
    problems = index.get(generation.benchmark)
    if problems is None:
        raise InputError(
            origin,
            f"unknown benchmark {generation.benchmark!r}; known here: "
            f"{', '.join(sorted(index))} (name other problem sets in `benchmarks` as NAME=PATH)",
            line=numbered.line,
            field="benchmark",
        )
    problem = problems.get(generation.problem_id)
    if problem is None:
        raise InputError(
            origin,
            f"{generation.benchmark} has no problem {generation.problem_id!r}",
            line=numbered.line,
            field="problem_id",
        )
    return problem.answer


def as_problem_sets(
    benchmarks: Mapping[str, Sequence[MathProblem] | ProblemSet],
) -> dict[str, ProblemSet]:
    """Problem sets by name; a bare list of problems under a registry name is that benchmark."""
    sets: dict[str, ProblemSet] = {}
    for name, value in benchmarks.items():
        if isinstance(value, ProblemSet):
            sets[name] = value
            continue
        spec = get_benchmark(name)
        sets[name] = ProblemSet(
            name=name,
            title=spec.title,
            answer_format=spec.answer_format,
            source=ProblemSource(name=name, kind="registry"),
            problems=list(value),
        )
    return sets


def score_generations(
    generations: Sequence[NumberedGeneration],
    benchmarks: Mapping[str, Sequence[MathProblem] | ProblemSet],
    grader: Grader | SandboxedGrading,
    *,
    origin: str,
    ks: Sequence[int] | None = None,
    on_graded: ProgressCallback | None = None,
) -> ScoreResult:
    """Grade every generation against its problem's gold and aggregate.

    ``benchmarks`` maps names to problem sets (or registry names to their loaded problems). A
    generation naming an unknown benchmark or problem is an InputError that points at its line
    in ``origin``. Code and IFEval sets need a ``SandboxedGrading`` around the grader.
    """
    sets = as_problem_sets(benchmarks)
    index = {name: {p.id: p for p in problem_set.problems} for name, problem_set in sets.items()}
    golds = [_gold_of(numbered, index, origin) for numbered in generations]
    formats = [sets[n.generation.benchmark].answer_format for n in generations]
    grades = grader.grade_many(
        [n.generation.response for n in generations],
        golds,
        answer_format=formats,
        on_graded=on_graded,
    )
    samples = [
        ScoredSample(generation=n.generation, grade=grade)
        for n, grade in zip(generations, grades, strict=True)
    ]
    return aggregate_scores(
        samples,
        sets,
        origin=origin,
        boxed_fallback=grader.config.boxed_fallback,
        timeout_s=grader.config.timeout_s,
        ks=ks,
    )


def aggregate_scores(
    samples: Sequence[ScoredSample],
    sets: Mapping[str, ProblemSet],
    *,
    origin: str,
    boxed_fallback: bool,
    timeout_s: float,
    ks: Sequence[int] | None = None,
) -> ScoreResult:
    """Per-problem and per-benchmark metrics of graded samples, in the order of ``sets`` (a set
    without samples gets no row; within a problem, samples count in ``sample_index`` order)."""
    grouped: dict[str, dict[str, list[ScoredSample]]] = defaultdict(lambda: defaultdict(list))
    for sample in sorted(samples, key=lambda s: s.generation.sample_index):
        grouped[sample.generation.benchmark][sample.generation.problem_id].append(sample)
    benchmark_scores: list[BenchmarkScore] = []
    problem_scores: list[ProblemScore] = []
    for name in [name for name in sets if name in grouped]:
        by_problem = grouped[name]
        benchmark_scores.append(_score_benchmark(sets[name], by_problem, ks))
        problem_scores += [
            _score_problem(problem, name, by_problem[problem.id])
            for problem in sets[name].problems
            if problem.id in by_problem
        ]
    report = ScoreReport(
        generations=origin,
        boxed_fallback=boxed_fallback,
        timeout_s=timeout_s,
        benchmarks=benchmark_scores,
    )
    return ScoreResult(report=report, problems=problem_scores, samples=list(samples))
