"""The arithmetic of ``demo --ablation-async``'s report: runs' figures from their metrics, the
wall-clock to the target accuracy, the speed-up, the ideal overlap, and each run's load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2_train.demo.staleness import (
    LOAD_FILE,
    AblationRun,
    CurvePoint,
    crossing,
    measured_load,
    run_record,
    summarize,
)


def curve(*points: tuple[int, float, float]) -> list[CurvePoint]:
    return [CurvePoint(step=s, elapsed_s=t, accuracy=a) for s, t, a in points]


def test_crossing_is_the_first_time_the_curve_reaches_the_target() -> None:
    rising = curve((0, 0, 0.5), (10, 100, 0.7), (20, 200, 0.9), (30, 300, 0.8))
    assert crossing(rising, 0.8) == pytest.approx(150.0)  # halfway from 0.7 to 0.9
    assert crossing(rising, 0.9) == 200.0
    assert crossing(rising, 0.5) == 0.0  # the start already is there
    assert crossing(rising, 0.95) is None


def run(arm: int, seed: int, points: list[CurvePoint], **figures: float) -> AblationRun:
    defaults = {
        "trainer_idle": 0.5,
        "engine_idle": 0.2,
        "rollout_s": 60.0,
        "update_s": 30.0,
    }
    defaults.update(figures)
    return AblationRun(
        max_staleness=arm,
        seed=seed,
        run_dir=f"runs/{arm}-{seed}",
        steps=points[-1].step,
        elapsed_s=points[-1].elapsed_s,
        curve=points,
        lag_mean=None if arm == 0 else 0.9,
        **defaults,
    )


def test_the_speed_up_compares_both_arms_first_times_at_the_synchronous_final_accuracy() -> None:
    # The synchronous mean curve reaches its final accuracy (0.8) at step 10, before its end.
    sync = [
        run(0, 0, curve((0, 0, 0.6), (10, 100, 0.8), (20, 200, 0.8)), rollout_s=60, update_s=30),
        run(0, 1, curve((0, 0, 0.6), (10, 140, 0.8), (20, 240, 0.8)), rollout_s=80, update_s=50),
    ]
    eta1 = [
        run(1, 0, curve((0, 0, 0.6), (10, 60, 0.7), (20, 120, 0.9))),
        run(1, 1, curve((0, 0, 0.6), (10, 80, 0.7), (20, 160, 0.7))),
    ]
    result = summarize([*sync, *eta1], trainer=[0], engine=[1])
    assert result.target_accuracy == pytest.approx(0.8)
    by_arm = {arm.max_staleness: arm for arm in result.arms}
    assert by_arm[0].time_to_target_s == pytest.approx(120.0)  # mean wall-clock at step 10
    assert by_arm[0].speedup_to_target == pytest.approx(1.0)
    # eta 1's mean curve: 0.7 at 70 s, 0.8 at 140 s: reached at 140 s.
    assert by_arm[1].time_to_target_s == pytest.approx(140.0)
    assert by_arm[1].speedup_to_target == pytest.approx(120.0 / 140.0)
    assert by_arm[1].final_accuracy_mean == pytest.approx(0.8)
    assert by_arm[1].final_accuracy_spread == (0.7, 0.9)
    assert by_arm[1].steps_per_hour == pytest.approx((20 / 120 + 20 / 160) / 2 * 3600)
    assert by_arm[1].lag_mean == pytest.approx(0.9)
    assert by_arm[0].lag_mean is None
    # (rollouts + updates) / max of the two, summed over the synchronous runs' steps.
    assert result.ideal_overlap == pytest.approx((140 + 80) / 140)


def test_an_arm_that_never_reaches_the_target_has_no_speed_up() -> None:
    sync = [run(0, 0, curve((0, 0, 0.6), (10, 100, 0.9)))]
    slow = [run(1, 0, curve((0, 0, 0.6), (10, 50, 0.8)))]
    arm = summarize([*sync, *slow], trainer=[0], engine=[1]).arms[1]
    assert (arm.time_to_target_s, arm.speedup_to_target) == (None, None)
    with pytest.raises(ValueError, match="synchronous runs"):
        summarize(slow, trainer=[0], engine=[1])


def test_a_run_record_adds_up_its_metrics(tmp_path: Path) -> None:
    rows = [
        {"step": 0, "time/elapsed_s": 0.0},  # a row before the first step is not a step
        {
            "step": 1,
            "time/elapsed_s": 10.0,
            "time/step_s": 10.0,
            "time/rollout_s": 6.0,
            "time/reward_s": 1.0,
            "time/update_s": 2.0,
            "time/sync_s": 1.0,
            "trainer/idle_s": 7.0,
            "engines/idle_fraction": 0.5,
            "staleness/lag_mean": 0.0,
        },
        {
            "step": 2,
            "time/elapsed_s": 40.0,
            "time/step_s": 30.0,
            "time/rollout_s": 20.0,
            "time/update_s": 4.0,
            "trainer/idle_s": 3.0,
            "engines/idle_fraction": 0.1,
            "staleness/lag_mean": 1.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    record = run_record(tmp_path, 1, 7, {0: 0.5, 2: 0.75})
    assert (record.steps, record.elapsed_s, record.final_accuracy) == (2, 40.0, 0.75)
    assert record.curve[0] == CurvePoint(step=0, elapsed_s=0.0, accuracy=0.5)
    assert record.curve[1] == CurvePoint(step=2, elapsed_s=40.0, accuracy=0.75)
    assert record.trainer_idle == pytest.approx(10 / 40)
    assert record.engine_idle == pytest.approx((0.5 * 10 + 0.1 * 30) / 40)  # time-weighted
    assert (record.rollout_s, record.update_s) == (27.0, 7.0)
    assert record.lag_mean == pytest.approx(0.5)
    assert record.steps_per_hour == pytest.approx(2 / 40 * 3600)
    assert record.load is None  # not recorded: said so, never made up


def test_the_load_is_recorded_while_a_run_trains_and_only_when_it_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = iter([1.0, 2.0, 3.0, 6.0])
    monkeypatch.setattr("os.getloadavg", lambda: (next(loads), 0.0, 0.0))
    with measured_load(tmp_path, every_s=3600):  # no sample between start and end
        pass
    recorded = json.loads((tmp_path / LOAD_FILE).read_text())
    assert recorded == {"start": 1.0, "end": 2.0, "mean": 1.5}
    failed = tmp_path / "failed"
    failed.mkdir()
    with pytest.raises(RuntimeError), measured_load(failed, every_s=3600):
        raise RuntimeError("the run stopped")
    assert not (failed / LOAD_FILE).exists()
