"""The identical-samples check: when k samples at temperature > 0 are copies, say so and why."""

from __future__ import annotations

from rstar2_eval import EvalSettings
from rstar2_eval.diversity import check_diversity
from rstar2_eval.generations import Generation
from rstar2_eval.grading import Grade
from rstar2_eval.scoring import ScoredSample
from rstar2_scheduler.engines import OpenAIEngine, OpenAIEngineConfig, ServerCapabilities


def sample(problem: str, index: int, response: str) -> ScoredSample:
    generation = Generation(
        benchmark="b", problem_id=problem, sample_index=index, response=response
    )
    return ScoredSample(
        generation=generation, grade=Grade(correct=False, status="no_answer", answer=None)
    )


def copies(problems: int, k: int, *, differing: int = 0) -> list[ScoredSample]:
    """``k`` samples of each problem; the first ``differing`` problems get distinct samples."""
    return [
        sample(f"p{p}", i, f"response {p}" + (f" take {i}" if p < differing else ""))
        for p in range(problems)
        for i in range(k)
    ]


def test_copies_at_temperature_collapse() -> None:
    settings = EvalSettings(samples=4, temperature=0.6)
    diversity = check_diversity(copies(10, 4), settings, [])
    assert (diversity.expected, diversity.problems, diversity.identical) == (True, 10, 10)
    assert diversity.collapsed
    assert diversity.cause is not None
    assert "deterministic at temperature 0.6" in diversity.cause
    assert "10 of 10 problems with several samples got identical samples" in diversity.message()


def test_nearly_every_problem_is_enough_and_a_few_copies_are_not() -> None:
    settings = EvalSettings(samples=2, temperature=1.0)
    assert check_diversity(copies(10, 2, differing=1), settings, []).collapsed  # 90%
    two = check_diversity(copies(10, 2, differing=2), settings, [])  # 80%: a confident model
    assert (two.identical, two.collapsed, two.cause) == (8, False, None)


def test_copies_are_expected_greedily_or_with_one_sample() -> None:
    assert not check_diversity(copies(5, 3), EvalSettings(samples=3, temperature=0.0), []).collapsed
    single = check_diversity(copies(5, 1), EvalSettings(samples=1, temperature=1.0), [])
    assert (single.expected, single.problems, single.collapsed) == (False, 0, False)


def test_the_cause_names_a_server_that_takes_no_sampling_switch() -> None:
    engine = OpenAIEngine(OpenAIEngineConfig(base_url="http://host:8000/v1", model="m"))
    engine._capabilities = ServerCapabilities(  # what a probe of such a server records
        url="http://host:8000/v1",
        prompt="text",
        extension_fields=False,
        sampling_switch="temperature",
        completion_ids="reencoded",
        token_counts="server",
        logprobs=False,
        special_tokens_kept=False,
        stop_token_logprob="masked",
        notes=[],
    )
    diversity = check_diversity(copies(3, 2), EvalSettings(samples=2, temperature=1.0), [engine])
    assert diversity.cause is not None
    assert diversity.cause.startswith("http://host:8000/v1 takes no sampling switch")
    assert '"do_sample": true' in diversity.cause
