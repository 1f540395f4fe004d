"""rstar2-eval.

Evaluator for math reasoning checkpoints: answer extraction and grading, metrics (avg@k, unbiased
pass@k, maj@k), the benchmark registry, and scoring of generation files.
"""

from importlib.metadata import version

from rstar2_eval.errors import InputError
from rstar2_eval.extraction import Extraction, extract_answer, find_boxed
from rstar2_eval.generations import Generation, read_generations
from rstar2_eval.grading import (
    Grade,
    GradeMethod,
    Grader,
    GraderConfig,
    GradeStatus,
    agrade_many,
    grade_many,
)
from rstar2_eval.loading import load_benchmark, normalize_answer
from rstar2_eval.metrics import majority_vote, mean_accuracy, pass_at_k
from rstar2_eval.pool import GradingError, VerifierPool
from rstar2_eval.registry import BENCHMARKS, BenchmarkSpec, get_benchmark
from rstar2_eval.scoring import (
    BenchmarkScore,
    ProblemScore,
    ScoredSample,
    ScoreReport,
    ScoreResult,
    score_generations,
)
from rstar2_eval.verification import AnswerFormat, normalize_choice

__version__ = version("rstar2-eval")

__all__ = [
    "BENCHMARKS",
    "AnswerFormat",
    "BenchmarkScore",
    "BenchmarkSpec",
    "Extraction",
    "Generation",
    "Grade",
    "GradeMethod",
    "GradeStatus",
    "Grader",
    "GraderConfig",
    "GradingError",
    "InputError",
    "ProblemScore",
    "ScoreReport",
    "ScoreResult",
    "ScoredSample",
    "VerifierPool",
    "__version__",
    "agrade_many",
    "extract_answer",
    "find_boxed",
    "get_benchmark",
    "grade_many",
    "load_benchmark",
    "majority_vote",
    "mean_accuracy",
    "normalize_answer",
    "normalize_choice",
    "pass_at_k",
    "read_generations",
    "score_generations",
]
