"""``evaluate`` as a trainer calls it: its own engines, sandbox and grader, problem sets in memory
or from the registry, and results that do not depend on interruptions or placement."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rstar2_data import load_built
from rstar2_data.demo import demo_problems
from rstar2_eval import (
    AnswerFormat,
    AsyncGrader,
    EvalSettings,
    Grade,
    Grader,
    GraderConfig,
    ModelInfo,
    ProblemSet,
    evaluate,
    sample_seed,
)
from rstar2_sandbox.local import LocalSandbox
from rstar2_sandbox.models import RunRequest
from rstar2_scheduler import (
    Engine,
    GenerationRequest,
    GenerationResult,
    KVStats,
    SamplingParams,
    TransformersEngine,
    TransformersEngineConfig,
)


class SeedEcho(Engine):
    """Answers each request at once with ``\\boxed{seed % 97}``; fails once ``budget`` runs out.

    Its answers depend on the request's seed alone, as sampled answers do.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, name: str, budget: int | None = None):
        self.tokenizer = tokenizer
        self.name = name
        self.budget = budget
        self.seeds: list[int | None] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.seeds.append(request.sampling.seed)
        if self.budget is not None:
            if self.budget == 0:
                return GenerationResult.failed(request.request_id, "out of budget")
            self.budget -= 1
        seed = request.sampling.seed or 0
        text = f"\nIt is {seed % 97}.\n</reason>\n<answer>\\boxed{{{seed % 97}}}</answer>"
        ids = [
            *self.tokenizer.encode(text, add_special_tokens=False),
            request.sampling.stop_token_ids[0],
        ]
        return GenerationResult(
            request_id=request.request_id,
            token_ids=tuple(ids),
            logprobs=tuple(0.0 for _ in ids),
            finish_reason="stop",
        )

    def kv_stats(self) -> KVStats:
        return KVStats(capacity_tokens=1 << 20, used_tokens=0)


def lines(path: Path) -> set[str]:
    return set(path.read_text().splitlines())


@pytest.mark.asyncio
async def test_results_do_not_depend_on_interruptions_or_engines(
    checkpoint: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    sets = [ProblemSet.of("heldout", demo_problems(6, seed=5))]
    settings = EvalSettings(samples=3, temperature=1.0, max_tokens=200, max_turns=2, seed=9)
    async with LocalSandbox() as sandbox:
        with Grader(GraderConfig(workers=1)) as grader:

            async def run(engines: list[Engine], out: Path) -> None:
                await evaluate(engines, tokenizer, sandbox, grader, sets, settings, out_dir=out)

            await run([SeedEcho(tokenizer, "one")], tmp_path / "whole")
            # Interrupted by failures after 5 rollouts, then resumed on two other engines.
            flaky = SeedEcho(tokenizer, "flaky", budget=5)
            await run([flaky], tmp_path / "pieces")
            partial = json.loads((tmp_path / "pieces" / "run.json").read_text())
            assert partial["status"] == "incomplete"
            assert partial["rollouts"]["generated"] == 5
            assert partial["rollouts"]["failed"] == 13
            await run([SeedEcho(tokenizer, "a"), SeedEcho(tokenizer, "b")], tmp_path / "pieces")
    whole = tmp_path / "whole" / "generations.jsonl"
    pieces = tmp_path / "pieces" / "generations.jsonl"
    assert len(lines(whole)) == 18
    assert lines(pieces) == lines(whole)
    expected = {sample_seed(9, "heldout", p.id, i) for p in sets[0].problems for i in range(3)}
    # Each rollout's only turn is seeded from its sample's own seed.
    assert set(flaky.seeds) <= {s * 1_000_003 % 2**63 for s in expected}


class CountingGrading:
    """Not a ``Grader``: what a trainer's grading looks like (its config and ``agrade_many``)."""

    def __init__(self, grader: Grader) -> None:
        self.config = grader.config
        self.grader = grader
        self.calls = 0

    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        self.calls += 1
        return await self.grader.agrade_many(responses, golds, answer_format=answer_format)


@pytest.mark.asyncio
async def test_evaluate_grades_through_any_async_grader(checkpoint: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    sets = [ProblemSet.of("heldout", demo_problems(4, seed=5))]
    settings = EvalSettings(samples=2, temperature=1.0, max_tokens=200, max_turns=2, seed=9)
    with Grader(GraderConfig(workers=1)) as grader:
        grading = CountingGrading(grader)
        assert isinstance(grading, AsyncGrader)
        engine = SeedEcho(tokenizer, "one")
        through = await evaluate([engine], tokenizer, _NoSandbox(), grading, sets, settings)
        direct = await evaluate([engine], tokenizer, _NoSandbox(), grader, sets, settings)
    assert grading.calls >= 1
    assert through.score == direct.score
    assert through.rollouts.generated == 8


@pytest.mark.asyncio
async def test_validation_with_the_trainers_engine_leaves_everything_running(
    checkpoint: Path, demo_set: Path, data_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    config = TransformersEngineConfig(kv_budget_tokens=4 * 1200, max_batch_size=4, name="policy")
    engine = TransformersEngine.from_pretrained(checkpoint, config)
    sets = [
        ProblemSet.of("heldout", load_built(demo_set)),  # e.g. the demo's held-out split
        ProblemSet.registry("aime24", data_dir),
    ]
    settings = EvalSettings(samples=2, temperature=0.0, max_tokens=400, max_turns=4, limit=2)
    out = tmp_path / "validation" / "step-000001"
    async with LocalSandbox() as sandbox, engine:
        with Grader(GraderConfig(workers=1)) as grader:
            model = ModelInfo(kind="engines", name="policy", revision="step-1")
            report = await evaluate(
                [engine], tokenizer, sandbox, grader, sets, settings, model=model, out_dir=out
            )
            again = await evaluate(
                [engine], tokenizer, sandbox, grader, sets, settings, model=model, out_dir=out
            )
            # Nothing evaluate was given was closed: the trainer keeps using all of it.
            request = GenerationRequest(
                request_id="after",
                prompt_ids=(1, 2, 3),
                sampling=SamplingParams(max_new_tokens=2, temperature=0.0),
            )
            assert (await engine.generate(request)).finish_reason in ("stop", "length")
            assert (await sandbox.run(RunRequest(code="print(6 * 7)"))).stdout == "42\n"
            assert grader.grade_many([r"<answer>\boxed{\frac{1}{2}}</answer>"], ["0.5"])[0].correct
    assert report.chat_template == "rstar2"
    assert report.rollouts.generated == 8
    assert (again.rollouts.resumed, again.rollouts.generated) == (8, 0)
    assert again.score == report.score
    metrics = report.metrics(prefix="val/")
    assert metrics["val/heldout/avg@2"] == 1.0
    assert metrics["val/heldout/tool_calls_per_rollout"] == 1.0
    assert metrics["val/heldout/tool_error_ratio"] == 0.0
    assert metrics["val/heldout/truncation_rate"] == 0.0
    assert 0.0 <= metrics["val/aime24/pass@2"] <= 1.0
    assert not any(math.isnan(value) for value in metrics.values())
    record = json.loads((out / "run.json").read_text())
    assert record["spec"]["model"]["revision"] == "step-1"
    assert record["options"] is None


@pytest.mark.asyncio
async def test_a_problem_set_given_twice_is_refused(checkpoint: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    twice = [ProblemSet.of("a", demo_problems(1, seed=1))] * 2
    with Grader(GraderConfig(workers=1)) as grader, pytest.raises(ValueError, match="twice"):
        await evaluate([SeedEcho(tokenizer, "e")], tokenizer, _NoSandbox(), grader, twice)


class _NoSandbox:
    async def run(self, request: RunRequest) -> None:
        raise AssertionError("not reached")

    async def run_many(self, requests: list[RunRequest]) -> None:
        raise AssertionError("not reached")

    async def aclose(self) -> None:
        return None


def test_sample_seeds_depend_on_the_sample_alone() -> None:
    seeds = {
        sample_seed(0, name, pid, i) for name in ("a", "b") for pid in ("1", "2") for i in range(8)
    }
    assert len(seeds) == 32
    assert sample_seed(0, "a", "1", 3) == sample_seed(0, "a", "1", 3)
    assert sample_seed(1, "a", "1", 3) != sample_seed(0, "a", "1", 3)
    assert all(0 <= seed < 2**63 for seed in seeds)
