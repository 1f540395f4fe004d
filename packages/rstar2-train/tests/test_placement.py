"""Ray placement on CPU: data-parallel ranks over gloo, engine and grader actors, weight sync,
failures.

One local Ray cluster (2 CPUs, small object store) serves the whole module.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from models import reference_logprobs, tiny_model
from tiny_runs import DemoData
from tiny_runs import rl_config as rl_stage_config

from rstar2_eval import Grader, GraderConfig
from rstar2_scheduler import GenerationRequest, RolloutJob, RolloutScheduler, SamplingParams
from rstar2_train import Actor, TokenSequence, load_config, read_metrics, run_stage
from rstar2_train.checkpoint import list_checkpoints
from rstar2_train.config import RLConfig
from rstar2_train.config.schema import TrainerPlacement
from rstar2_train.placement import DistributedActor
from rstar2_train.placement.engines import (
    EngineGroup,
    EngineHost,
    EnginesLostError,
    EngineSpec,
    RayEngine,
)
from rstar2_train.placement.grading import GraderHost, GradersLostError, RayGrading
from rstar2_train.precision import Precision
from rstar2_train.rl.update import ENGINE_LOGPROBS, policy_update

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=300 * 2**20,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    yield
    ray.shutdown()


def rollouts(model: torch.nn.Module, count: int) -> list[TokenSequence]:
    """Prompt + response sequences of varied lengths, with the model's own log-probs."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        ids = torch.randint(1, 97, (6 + 4 + 3 * i,), generator=generator).tolist()
        mask = [0] * 6 + [1] * (len(ids) - 6)
        own = [0.0, *reference_logprobs(model, ids).tolist()]
        engine = [lp if m else 0.0 for lp, m in zip(own, mask, strict=True)]
        out.append(TokenSequence(ids=ids, mask=mask, token_values={ENGINE_LOGPROBS: engine}))
    return out


def rl_config(*overrides: str) -> RLConfig:
    config = load_config("tiny-rl", list(overrides)).rl
    assert config is not None
    return config


def optimizer_settings(lr: float = 1e-2):  # type: ignore[no-untyped-def]
    config = load_config(
        "tiny-rl", [f"optimizer.lr={lr}", "optimizer.grad_clip=1.0", "schedule.warmup_steps=0"]
    )
    return config.optimizer, config.schedule


def distributed(ranks: int, seed: int = 0) -> DistributedActor:
    optimizer, schedule = optimizer_settings()
    return DistributedActor(
        tiny_model(seed=seed),
        optimizer,
        schedule,
        total_steps=10,
        placement=TrainerPlacement(ranks=ranks, cpus=0.25),
        precision=FLOAT32,
    )


FLOAT32 = Precision(torch.float32, torch.float32)  # the tiny models train in float32


def single(seed: int = 0) -> Actor:
    optimizer, schedule = optimizer_settings()
    return Actor(tiny_model(seed=seed), optimizer, schedule, total_steps=10)


ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.5]


def step(actor: object, budget: int = 40) -> dict[str, float]:
    model = tiny_model()
    seqs = rollouts(model, len(ADVANTAGES))
    return policy_update(
        actor,  # type: ignore[arg-type]
        seqs,
        ADVANTAGES,
        rl_config(f"rl.micro_batch_tokens={budget}"),
        temperature=1.0,
        pad_id=0,
        seed=0,
    )


def max_weight_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_two_gloo_ranks_match_one_process(cluster: None) -> None:
    one = single()
    reference = step(one)
    two = distributed(2)
    try:
        got = step(two)
        weights = dict(two.named_weights())
    finally:
        two.close()
    # Same batch, same loss normalisation: loss, gradient norm and weights agree (fp32).
    assert got["actor/pg_loss"] == pytest.approx(reference["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert got["actor/grad_norm"] == pytest.approx(reference["actor/grad_norm"], rel=1e-5)
    before = tiny_model().state_dict()
    assert max_weight_gap(before, weights) > 1e-4  # the step moved the weights...
    gap = max_weight_gap(one.model.state_dict(), weights)
    print(f"max weight gap 2 ranks vs 1 process: {gap:.2e}")
    # ...the same way: Adam's first step moves a weight by about lr (1e-2); summing the ranks'
    # gradients in another order leaves fp32 rounding, which dividing by sqrt(v) can magnify
    # for near-zero gradients, far below that step.
    assert gap < 1e-5


def test_optimizer_state_from_two_ranks_resumes_in_one_process(cluster: None) -> None:
    two = distributed(2)
    try:
        step(two)
        saved_weights = two.export_model().state_dict()
        saved = two.optimizer_state()
        step(two)  # the second step, continued on two ranks
        continued = dict(two.named_weights())
    finally:
        two.close()
    one = single()
    one.model.load_state_dict(saved_weights)
    # torch.optim adopts the loaded tensors and updates them in place: keep ``saved`` intact.
    one.load_optimizer_state(copy.deepcopy(saved), resume=True)
    assert one.schedule.last_epoch == 1
    step(one)  # the same second step, resumed in one process
    gap = max_weight_gap(one.model.state_dict(), continued)
    print(f"max weight gap after resuming in one process: {gap:.2e}")
    assert gap < 1e-6
    # ...and sharded again over another number of ranks (here one FSDP rank).
    model = tiny_model()
    model.load_state_dict(saved_weights)
    optimizer, schedule = optimizer_settings()
    resumed = DistributedActor(
        model,
        optimizer,
        schedule,
        total_steps=10,
        placement=TrainerPlacement(ranks=1, cpus=0.25),
        precision=FLOAT32,
    )
    try:
        resumed.load_optimizer_state(saved, resume=True)
        step(resumed)
        gap = max_weight_gap(dict(resumed.named_weights()), continued)
    finally:
        resumed.close()
    print(f"max weight gap after resuming on 1 FSDP rank: {gap:.2e}")
    assert gap < 1e-6


def engine_group(count: int) -> tuple[EngineGroup, list[RayEngine]]:
    host = ray.remote(EngineHost)
    model = ray.put(tiny_model())
    names = [f"engine-{i}" for i in range(count)]
    handles = [
        host.options(num_cpus=0.25, max_concurrency=100).remote(
            EngineSpec(kind="transformers", name=name, seed=i, kv_budget_tokens=4096), model, 1
        )
        for i, name in enumerate(names)
    ]
    group = EngineGroup(handles, names)
    capabilities = ray.get([h.capabilities.remote() for h in handles])
    return group, [RayEngine(group, i, capabilities[i]) for i in range(count)]


def test_engine_actor_killed_mid_phase_its_rollouts_finish_elsewhere(cluster: None) -> None:
    group, engines = engine_group(2)
    turns, finished = 4, []

    def job(index: int) -> RolloutJob[list[int]]:
        async def run(engine: object) -> list[int]:
            ids = [1 + index, 2, 3]
            for turn in range(turns):  # multi-turn: each request carries the whole prefix
                result = await engine.generate(  # type: ignore[attr-defined]
                    GenerationRequest(
                        request_id=f"r{index}-{turn}",
                        prompt_ids=tuple(ids),
                        sampling=SamplingParams(max_new_tokens=8, seed=index * 10 + turn),
                    )
                )
                assert result.finish_reason != "error", result.error
                ids += result.token_ids
                if turn == 0 and index == 0:
                    ray.kill(group.handles[1])  # engine-1 dies while rollouts are on it
            return ids

        return RolloutJob(run=run, kv_tokens=64, key=f"j{index}")

    async def phase() -> None:
        scheduler = RolloutScheduler(engines, policy="static")
        result = await scheduler.run([job(i) for i in range(6)], on_result=finished.append)
        assert result.metrics.failed == 0
        assert all(len(r.value or []) == 3 + 8 * turns for r in result.results)

    asyncio.run(phase())
    assert list(group.dead) == [1]
    assert len(finished) == 6
    # With every actor gone the step fails with a clear error instead of training on nothing.
    kill_actor(group.handles[0], "kv_stats")
    with pytest.raises(EnginesLostError, match="all 2 engine actors died"):
        asyncio.run(group.call("reset_prefix_cache"))


def kill_actor(handle: Any, probe: str) -> None:
    """Kill an actor and wait until calls to it fail: ``ray.kill`` returns before the actor is
    gone, and a call sent in between may still be served."""
    ray.kill(handle)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(getattr(handle, probe).remote())
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def test_grader_actors_share_batches_and_a_dead_ones_go_to_the_others(cluster: None) -> None:
    config = GraderConfig(workers=1)
    host = ray.remote(GraderHost)
    names = ["grader-0", "grader-1"]
    grading = RayGrading([host.options(num_cpus=0.25).remote(config) for _ in names], names, config)
    responses = [f"<answer>\\boxed{{{n}}}</answer>" for n in range(6)]
    golds = ["0", "1", "2", "0", "0", "0"]

    def grade_all() -> list[bool]:
        async def batches() -> list[list[bool]]:
            graded = await asyncio.gather(
                *(grading.agrade_many([r], [g]) for r, g in zip(responses, golds, strict=True))
            )
            return [[grade.correct for grade in batch] for batch in graded]

        return [correct for batch in asyncio.run(batches()) for correct in batch]

    with Grader(config) as local:
        expected = [grade.correct for grade in local.grade_many(responses, golds)]
    assert expected == [True, True, True, False, False, False]
    asyncio.run(grading.warm_up())  # every actor's workers, before the first step
    assert grade_all() == expected
    # Six batches at once, each to the least busy actor: three each, graded in the actors.
    assert ray.get([h.graded_items.remote() for h in grading.handles]) == [3, 3]
    assert grading.metrics() == {"grader/actors_lost": 0.0}
    # A dead actor's batches are graded by the live one.
    kill_actor(grading.handles[1], "graded_items")
    assert grade_all() == expected
    assert grading.metrics() == {"grader/actors_lost": 1.0}
    assert ray.get(grading.handles[0].graded_items.remote()) == 9
    # With none left, a clear error names them instead of waiting.
    kill_actor(grading.handles[0], "graded_items")
    lost = r"(?s)all 2 grader actors died \(grader-0: .*grader-1: .*resume the stage"
    with pytest.raises(GradersLostError, match=lost):
        asyncio.run(grading.agrade_many(["<answer>\\boxed{1}</answer>"], ["1"]))


PLACEMENT = (
    "placement={local_cpus: 2, trainer: {ranks: 2, cpus: 0.25}, engines: {cpus: 0.25}, "
    "sandbox: {servers: 1, cpus: 0.25}, grader: {actors: 2, cpus: 0.25}}"
)


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_rl_stage_on_ray_survives_a_killed_engine_and_grader(
    cluster: None, sft_run: Path, demo_data: DemoData, tmp_path: Path, max_staleness: int
) -> None:
    """Engine and grader actors die once step 1 is logged: step 2 runs on the others, no
    rollout is lost. With max_staleness 1, step 2's rollouts were admitted with step 1's and may
    all be generated and graded before the kill (on a loaded machine they often are): the dead
    engine is then met at the weight sync, and the dead grader by no call of step 2."""
    output = tmp_path / "rl"
    config = rl_stage_config(
        demo_data,
        sft_run / "final",
        output,
        "schedule.warmup_steps=0",
        f"rl.max_staleness={max_staleness}",
        "rl.engines.count=2",
        f"rl.validation={{benchmarks: [demo={demo_data.problems}], samples: 1, temperature: 0}}",
        PLACEMENT,
    )
    metrics = output / "metrics.jsonl"
    graded: list[int] = []

    def kill_after_first_step() -> None:
        # engine-1 and grader-1 die once step 1 is logged: step 2 must run on the others.
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if metrics.is_file() and read_metrics(metrics):
                graders = [ray.get_actor(f"{config.name}-grader-{i}") for i in range(2)]
                graded.extend(ray.get([g.graded_items.remote() for g in graders]))
                ray.kill(ray.get_actor(f"{config.name}-engine-1"))
                ray.kill(graders[1])
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_after_first_step, daemon=True)
    killer.start()
    run_stage(config)
    killer.join()
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["rollouts/total"] == 18
        assert record["rollouts/failed"] == 0
    assert records[0]["engines/lost"] == 0
    assert records[1]["engines/lost"] == 1
    # Step 1's 18 rollouts were graded in the grader actors, both of them; step 2's batches
    # sent to the dead one were graded by the other; validation graded through them too.
    assert len(graded) == 2
    assert min(graded) > 0
    assert sum(graded) >= 18
    assert records[0]["grader/actors_lost"] == 0
    if max_staleness == 0:
        assert records[1]["grader/actors_lost"] == 1
    else:  # counted only where a call of step 2 came after the kill
        assert records[1]["grader/actors_lost"] in (0, 1)
    assert 0 <= records[1]["val/demo/avg@1"] <= 1
    validated = output / "validation" / "step-000002" / "generations.jsonl"
    assert len(validated.read_text().splitlines()) == 3
    assert records[0]["actor/trained_tokens"] > 0
    assert records[0]["time/sync_s"] > 0
    if max_staleness == 0:
        # Step 2 sampled with step 1's weights, gathered from the two ranks' shards.
        assert records[1]["mismatch/logprob_abs_max"] < 1e-3
    else:
        assert records[1]["staleness/lag_max"] <= 1
    assert [p.name for p in list_checkpoints(output / "checkpoints")] == [
        "step-000001",
        "step-000002",
    ]
