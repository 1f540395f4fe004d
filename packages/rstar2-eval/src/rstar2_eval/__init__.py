"""rstar2-eval.

Evaluator for math reasoning checkpoints: answer extraction and grading, metrics (avg@k, unbiased
pass@k, maj@k), the benchmark registry, scoring of generation files, and multi-turn tool-loop
evaluation of checkpoints, endpoints or running engines.

Names are loaded on first use: grading workers import this package, and the evaluation half pulls
in torch and transformers, which ``score`` and grading never need.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2_eval.errors import InputError as InputError
    from rstar2_eval.evaluation import EvalReport as EvalReport
    from rstar2_eval.evaluation import evaluate as evaluate
    from rstar2_eval.extraction import Extraction as Extraction
    from rstar2_eval.extraction import extract_answer as extract_answer
    from rstar2_eval.extraction import find_boxed as find_boxed
    from rstar2_eval.generations import Generation as Generation
    from rstar2_eval.generations import read_generations as read_generations
    from rstar2_eval.grading import AsyncGrader as AsyncGrader
    from rstar2_eval.grading import Grade as Grade
    from rstar2_eval.grading import GradeMethod as GradeMethod
    from rstar2_eval.grading import Grader as Grader
    from rstar2_eval.grading import GraderConfig as GraderConfig
    from rstar2_eval.grading import GradeStatus as GradeStatus
    from rstar2_eval.grading import agrade_many as agrade_many
    from rstar2_eval.grading import grade_many as grade_many
    from rstar2_eval.loading import load_benchmark as load_benchmark
    from rstar2_eval.loading import normalize_answer as normalize_answer
    from rstar2_eval.metrics import majority_vote as majority_vote
    from rstar2_eval.metrics import mean_accuracy as mean_accuracy
    from rstar2_eval.metrics import pass_at_k as pass_at_k
    from rstar2_eval.pool import GradingError as GradingError
    from rstar2_eval.pool import VerifierPool as VerifierPool
    from rstar2_eval.problem_sets import ProblemSet as ProblemSet
    from rstar2_eval.problem_sets import ProblemSource as ProblemSource
    from rstar2_eval.problem_sets import load_problem_sets as load_problem_sets
    from rstar2_eval.problem_sets import parse_sources as parse_sources
    from rstar2_eval.registry import BENCHMARKS as BENCHMARKS
    from rstar2_eval.registry import BenchmarkSpec as BenchmarkSpec
    from rstar2_eval.registry import get_benchmark as get_benchmark
    from rstar2_eval.run_command import RunOptions as RunOptions
    from rstar2_eval.run_command import arun_evaluation as arun_evaluation
    from rstar2_eval.run_command import run_evaluation as run_evaluation
    from rstar2_eval.run_dir import ModelInfo as ModelInfo
    from rstar2_eval.run_dir import RolloutCounts as RolloutCounts
    from rstar2_eval.run_dir import RunRecord as RunRecord
    from rstar2_eval.run_dir import RunSpec as RunSpec
    from rstar2_eval.scoring import BenchmarkScore as BenchmarkScore
    from rstar2_eval.scoring import ProblemScore as ProblemScore
    from rstar2_eval.scoring import ScoredSample as ScoredSample
    from rstar2_eval.scoring import ScoreReport as ScoreReport
    from rstar2_eval.scoring import ScoreResult as ScoreResult
    from rstar2_eval.scoring import aggregate_scores as aggregate_scores
    from rstar2_eval.scoring import score_generations as score_generations
    from rstar2_eval.settings import EvalSettings as EvalSettings
    from rstar2_eval.settings import sample_seed as sample_seed
    from rstar2_eval.verification import AnswerFormat as AnswerFormat
    from rstar2_eval.verification import normalize_choice as normalize_choice

    __version__: str

_EXPORTS = {
    "InputError": "rstar2_eval.errors",
    "Extraction": "rstar2_eval.extraction",
    "extract_answer": "rstar2_eval.extraction",
    "find_boxed": "rstar2_eval.extraction",
    "Generation": "rstar2_eval.generations",
    "read_generations": "rstar2_eval.generations",
    "AsyncGrader": "rstar2_eval.grading",
    "Grade": "rstar2_eval.grading",
    "GradeMethod": "rstar2_eval.grading",
    "Grader": "rstar2_eval.grading",
    "GraderConfig": "rstar2_eval.grading",
    "GradeStatus": "rstar2_eval.grading",
    "agrade_many": "rstar2_eval.grading",
    "grade_many": "rstar2_eval.grading",
    "load_benchmark": "rstar2_eval.loading",
    "normalize_answer": "rstar2_eval.loading",
    "majority_vote": "rstar2_eval.metrics",
    "mean_accuracy": "rstar2_eval.metrics",
    "pass_at_k": "rstar2_eval.metrics",
    "GradingError": "rstar2_eval.pool",
    "VerifierPool": "rstar2_eval.pool",
    "BENCHMARKS": "rstar2_eval.registry",
    "BenchmarkSpec": "rstar2_eval.registry",
    "get_benchmark": "rstar2_eval.registry",
    "BenchmarkScore": "rstar2_eval.scoring",
    "ProblemScore": "rstar2_eval.scoring",
    "ScoredSample": "rstar2_eval.scoring",
    "ScoreReport": "rstar2_eval.scoring",
    "ScoreResult": "rstar2_eval.scoring",
    "aggregate_scores": "rstar2_eval.scoring",
    "score_generations": "rstar2_eval.scoring",
    "AnswerFormat": "rstar2_eval.verification",
    "normalize_choice": "rstar2_eval.verification",
    "ProblemSet": "rstar2_eval.problem_sets",
    "ProblemSource": "rstar2_eval.problem_sets",
    "load_problem_sets": "rstar2_eval.problem_sets",
    "parse_sources": "rstar2_eval.problem_sets",
    "EvalSettings": "rstar2_eval.settings",
    "sample_seed": "rstar2_eval.settings",
    "ModelInfo": "rstar2_eval.run_dir",
    "RolloutCounts": "rstar2_eval.run_dir",
    "RunRecord": "rstar2_eval.run_dir",
    "RunSpec": "rstar2_eval.run_dir",
    "EvalReport": "rstar2_eval.evaluation",
    "evaluate": "rstar2_eval.evaluation",
    "RunOptions": "rstar2_eval.run_command",
    "arun_evaluation": "rstar2_eval.run_command",
    "run_evaluation": "rstar2_eval.run_command",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("rstar2-eval")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rstar2_eval' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
