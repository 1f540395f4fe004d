"""Time to the first step is measured and split; a compiling attention compiles once, not once
per micro-batch shape."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from models import tiny_model
from transformers.integrations import flex_attention

from rstar2_scheduler.compilation import compile_count
from rstar2_train import Actor, TokenSequence, micro_batches, startup, token_logprobs
from rstar2_train.batching import collate
from rstar2_train.config.schema import OptimizerConfig, ScheduleConfig
from rstar2_train.startup import FirstStepClock

CPU = torch.device("cpu")


def sequences(lengths: list[int], seed: int = 0) -> list[TokenSequence]:
    rng = random.Random(seed)
    return [
        TokenSequence(ids=[rng.randrange(1, 97) for _ in range(n)], mask=[0, *[1] * (n - 1)])
        for n in lengths
    ]


@pytest.fixture
def eager_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``torch.compile`` with the ``eager`` backend: the compiler traces and guards exactly as
    with Inductor (so it recompiles on the same shapes), without generating C++ kernels on the
    CPU (a minute here). transformers' FlexAttention wrapper compiles once per process: it is
    reset so that it compiles with this backend."""
    compile_ = torch.compile

    def eager(model: Any = None, **options: Any) -> Any:
        options["backend"] = "eager"
        return compile_(model, **options) if model is not None else compile_(**options)

    monkeypatch.setattr(torch, "compile", eager)
    monkeypatch.setattr(startup, "_announced", set())  # announced once per process
    wrapper = flex_attention.WrappedFlexAttention
    monkeypatch.setattr(wrapper, "_instance", None)
    monkeypatch.setattr(wrapper, "_is_flex_compiled", False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("eager_compiler")
@pytest.mark.parametrize("padded", [True, False])
def test_flex_attention_compiles_once_over_micro_batches_of_different_widths(
    padded: bool, caplog: pytest.LogCaptureFixture
) -> None:
    model = tiny_model(seed=1, attention="flex_attention")
    budget = 64
    groups = [[30, 20, 9], [12, 40], [25, 25, 6, 3], [17]]  # packed widths 59, 52, 59, 17
    caplog.set_level(logging.INFO, logger="rstar2_train.startup")
    counts = []
    for lengths in groups:
        seqs = sequences(lengths)
        batch = collate(
            seqs,
            list(range(len(seqs))),
            packing=True,
            pad_id=0,
            device=CPU,
            row_tokens=budget if padded else None,
        )
        with torch.no_grad():  # FlexAttention has no backward pass on the CPU
            token_logprobs(model, batch)
        counts.append(compile_count())
    assert counts[0] > 0
    if padded:
        assert counts == [counts[0]] * len(groups)  # one compilation for every width
    else:
        assert counts[-1] > counts[0]  # what padding prevents: a compilation per new width
    assert "compiling attention kernels (flex_attention)" in caplog.text


def test_micro_batches_are_planned_with_their_row_budget() -> None:
    batches = micro_batches(sequences([30, 20, 9, 12]), 48, packing=True, pad_id=0, device=CPU)
    assert {batch.row_tokens for batch in batches} == {48}


def test_the_clock_splits_the_time_to_the_first_optimizer_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rstar2_train.startup")
    clock = FirstStepClock()
    try:
        with clock.model_build():
            model = tiny_model(seed=2)
        actor = Actor(model, OptimizerConfig(lr=1e-3), ScheduleConfig(), total_steps=2)
        batches = micro_batches(sequences([9, 14]), 64, packing=True, pad_id=0, device=CPU)
        with torch.no_grad():
            actor.logprobs(batches, temperature=1.0)  # no gradients: not the update yet

        def loss(index: int, batch: Any, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
            return -(logprobs * batch.mask).sum(), {}

        actor.update(batches, loss)
        assert clock.first_step is not None
        first = clock.first_step
        actor.update(batches, loss)
        assert clock.first_step == first  # the first step stays the first
        figures = clock.metrics()
    finally:
        clock.close()
    assert set(figures) == {
        "startup/first_step_s",
        "startup/model_build_s",
        "startup/first_update_s",
        "startup/compile_s",
    }
    assert 0 < figures["startup/model_build_s"] < figures["startup/first_step_s"]
    assert 0 < figures["startup/first_update_s"] < figures["startup/first_step_s"]
    assert figures["startup/compile_s"] == 0.0  # nothing compiled
    assert clock.metrics() == {}  # reported once
    assert "first optimizer step" in caplog.text


def test_a_stage_records_its_time_to_first_step_with_the_first_step(sft_run: Path) -> None:
    records = [json.loads(line) for line in (sft_run / "metrics.jsonl").read_text().splitlines()]
    first = records[0]
    assert first["startup/first_step_s"] >= first["startup/model_build_s"] > 0
    assert first["startup/first_update_s"] > 0
    assert first["startup/compile_s"] == 0.0
    assert not any("startup/first_step_s" in record for record in records[1:])
