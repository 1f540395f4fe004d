"""A step with nothing to train on advances the learning-rate schedule without a warning."""

from __future__ import annotations

import warnings

import torch

from rstar2_train.actor import advance_schedule


def test_a_step_without_an_update_advances_the_schedule_silently() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "lr_scheduler.step() before optimizer.step()"
        advance_schedule(schedule)
    assert optimizer.param_groups[0]["lr"] == 0.5
