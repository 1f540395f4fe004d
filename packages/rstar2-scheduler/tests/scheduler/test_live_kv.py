"""kv-aware live admission: the footprint forecast and LiveKVPolicy, driven step by step."""

from __future__ import annotations

import pytest

from rstar2_scheduler import Engine, GenerationRequest, GenerationResult, KVStats
from rstar2_scheduler.kv_forecast import FootprintForecast
from rstar2_scheduler.policies import EngineSlot, LiveKVPolicy, RolloutState

CAPACITY = 10_000
KV_TOKENS = 1000  # every rollout's prompt + max response
# Rollouts in a phase: reserving 1,000 x 1,000 tokens, far more than 8.6 x the cache of a few
# engines, so the forecast decides (a smaller phase would be placed at once).
PHASE = 1000


class GaugeEngine(Engine):
    """Reports whatever KV usage the test sets; placement never calls it."""

    def __init__(self, name: str, used: int = 0) -> None:
        self.name = name
        self.used = used

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise AssertionError("the policy never generates")

    def kv_stats(self) -> KVStats:
        return KVStats(capacity_tokens=CAPACITY, used_tokens=self.used)


def live_policy(engines: int = 1, *, headroom: float = 0.1) -> LiveKVPolicy:
    slots = [EngineSlot(i, GaugeEngine(f"e{i}")) for i in range(engines)]
    policy = LiveKVPolicy(slots, headroom=headroom)
    policy.prepare([KV_TOKENS] * PHASE)
    return policy


def place(policy: LiveKVPolicy, index: int, *, prompt: int = 100) -> RolloutState | None:
    """What the scheduler does: choose, count the rollout in, then its first call starts."""
    slot = policy.choose(index, KV_TOKENS)
    if slot is None:
        return None
    slot.active += 1
    rollout = RolloutState(index, slot, KV_TOKENS)
    policy.admitted(rollout)
    policy.track(rollout, context_tokens=prompt, generating=True)
    return rollout


def finish(policy: LiveKVPolicy, rollout: RolloutState, footprint: int) -> None:
    policy.track(rollout, context_tokens=footprint, generating=False)
    rollout.slot.active -= 1
    policy.finished(rollout, ok=True)


def fill(policy: LiveKVPolicy, start: int = 0) -> list[RolloutState]:
    placed: list[RolloutState] = []
    while (rollout := place(policy, start + len(placed))) is not None:
        placed.append(rollout)
    return placed


def test_with_no_footprints_seen_each_rollout_counts_its_whole_reservation() -> None:
    policy = live_policy(headroom=0.1)
    # 10% of 10,000 tokens stays free: 9 rollouts that may each reach 1,000 tokens.
    assert len(fill(policy)) == 9


def test_admission_keeps_the_live_usage_within_capacity_minus_headroom() -> None:
    policy = live_policy(headroom=0.1)
    (first,) = fill(policy)[:1]
    engine = first.slot.engine
    assert isinstance(engine, GaugeEngine)
    assert fill(policy, 100) == []  # nothing fits beside the 9
    # Its rollouts' turns now hold 8,500 tokens more than their prompts: nothing more fits.
    finish(policy, first, 120)
    engine.used = 8 * 100 + 8_500
    assert place(policy, 200) is None
    # The turns end and release their cache: the freed room is handed out again.
    engine.used = 8 * 100
    assert place(policy, 201) is not None


def test_learnt_footprints_let_more_rollouts_in_and_never_past_the_forecast() -> None:
    policy = live_policy(headroom=0.1)
    for index in range(200):
        rollout = place(policy, index)
        assert rollout is not None
        finish(policy, rollout, footprint=300)  # rollouts turn out to use 300 of their 1,000
    placed = fill(policy, 1000)
    assert 20 <= len(placed) <= 9_000 // 300
    load = policy.loads[0]
    assert max(load.projection) <= 0.9 * CAPACITY


def test_an_engine_with_none_of_the_phase_rollouts_takes_one_whatever_it_reports() -> None:
    policy = live_policy()
    engine = policy.slots[0].engine
    assert isinstance(engine, GaugeEngine)
    engine.used = CAPACITY  # another tenant fills it: no deadlock, the rollout still runs
    assert place(policy, 0) is not None
    assert place(policy, 1) is None


def test_new_rollouts_go_to_the_engine_with_the_lowest_forecast_peak() -> None:
    policy = live_policy(engines=2)
    placed = fill(policy)
    assert [r.slot.index for r in placed[:4]] == [0, 1, 0, 1]
    assert sum(r.slot.index for r in placed) == len(placed) // 2  # 9 on each


def test_bookkeeping_returns_to_zero_when_every_rollout_has_finished() -> None:
    policy = live_policy(engines=2)
    placed = fill(policy)
    for rollout in placed:  # a tool call, a second turn, then the end
        policy.track(rollout, context_tokens=400, generating=False)
        policy.track(rollout, context_tokens=480, generating=True)
        finish(policy, rollout, 700)
    policy.refresh_forecast()
    for load in policy.loads.values():
        assert load.idle_tokens == 0
        assert load.counts == [0] * policy.forecast.bins
        assert max(map(abs, load.projection)) == pytest.approx(0.0, abs=1e-6)
    assert sum(policy.forecast.finished) == len(placed)


def test_running_rollouts_count_as_censored_so_early_finishes_do_not_fool_the_forecast() -> None:
    forecast = FootprintForecast(8192, bins=64, min_at_risk=8)
    for _ in range(40):
        forecast.observe(500)  # the short rollouts finish first
    running = [0] * forecast.bins
    running[forecast.bin_of(3000)] = 100  # the others are still going, already past 3,000
    survival = forecast.survival(running)
    assert survival[forecast.bin_of(3000)] == pytest.approx(100 / 140)
    # Without them, all rollouts would look like they end by 500 tokens.
    assert forecast.survival([0] * forecast.bins)[forecast.bin_of(3000)] == 0.0


def test_unsupported_tail_of_the_forecast_goes_to_the_largest_footprint() -> None:
    forecast = FootprintForecast(8192, bins=64, min_at_risk=32)
    for _ in range(100):
        forecast.observe(200)
    for _ in range(10):
        forecast.observe(4000)  # too few past 200 to trust: they may reach the top
    forecast.refresh([0] * forecast.bins)
    survival = forecast.survival([0] * forecast.bins)
    assert survival[-1] == pytest.approx(10 / 110)
    # A rollout seen at 1,000 tokens is expected to run on to the top (bins count from centres).
    row = forecast.rows[forecast.bin_of(1000)]
    assert max(row) == pytest.approx(8192 - forecast.width / 2)


def test_the_support_a_bin_needs_grows_with_the_rollouts_in_flight() -> None:
    forecast = FootprintForecast(8192, bins=64, min_at_risk=8, min_at_risk_fraction=0.1)
    for _ in range(100):
        forecast.observe(200)
    for _ in range(20):
        forecast.observe(4000)
    few, many = [0] * forecast.bins, [0] * forecast.bins
    few[forecast.bin_of(100)] = 50  # 50 in flight: 8 at risk suffice, the 20 long ones count
    many[forecast.bin_of(100)] = 1000  # 1,000 in flight: a bin needs 100 at risk
    late = forecast.bin_of(6000)
    assert forecast.survival(few)[late] == 0.0  # trusted: nobody went past 4,000
    # Past 200 only the 20 long rollouts are at risk, too few for 1,000 in flight: the estimate
    # stops there (20 of the 120 finished ones got past 200) and lets them run on to the top.
    assert forecast.survival(many)[late] == pytest.approx(20 / 120)


def test_the_support_fraction_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="min_at_risk_fraction"):
        FootprintForecast(8192, min_at_risk_fraction=1.5)


def test_a_deferred_forecast_refresh_equals_refreshing_at_every_change() -> None:
    """The forecast is re-estimated when an admission reads it, from what it read when the
    re-estimate fell due: bit for bit what refreshing at every change gives."""
    eager, lazy = live_policy(engines=2), live_policy(engines=2)
    original = eager._changed

    def changed_now() -> None:
        original()
        eager.refresh_forecast()

    eager._changed = changed_now  # type: ignore[method-assign]
    placed = {id(policy): fill(policy) for policy in (eager, lazy)}
    for policy in (eager, lazy):
        for turn, rollout in enumerate(placed[id(policy)]):
            policy.track(rollout, context_tokens=150 + 37 * turn, generating=False)
            policy.track(rollout, context_tokens=260 + 53 * turn, generating=True)
            if turn % 3 == 0:
                finish(policy, rollout, 300 + 61 * turn)
        lazy.refresh_forecast()
    assert lazy.forecast.rows == eager.forecast.rows
    for index in eager.loads:
        assert lazy.loads[index].projection == eager.loads[index].projection
    # Both then admit the next rollout to the same engine (or both refuse it).
    eager_slot, lazy_slot = (policy.choose(999, KV_TOKENS) for policy in (eager, lazy))
    assert (eager_slot is None) == (lazy_slot is None)
    if eager_slot is not None and lazy_slot is not None:
        assert lazy_slot.index == eager_slot.index


class BatchEngine(GaugeEngine):
    """A gauge engine that decodes at most ``max_running`` requests at once."""

    def __init__(self, name: str, max_running: int) -> None:
        super().__init__(name)
        self.max_running = max_running

    def kv_stats(self) -> KVStats:
        return KVStats(
            capacity_tokens=CAPACITY, used_tokens=self.used, max_running=self.max_running
        )


def floor_policy(engines: int, max_running: int, rollouts: int) -> LiveKVPolicy:
    slots = [EngineSlot(i, BatchEngine(f"e{i}", max_running)) for i in range(engines)]
    policy = LiveKVPolicy(slots, headroom=0.1)
    policy.prepare([KV_TOKENS] * rollouts)
    return policy


def test_an_engine_fills_its_batch_before_any_footprint_is_known() -> None:
    # The forecast alone takes 9 (each may reach 1,000 of 10,000 tokens); a static split would
    # run a batch of 20 at once, and so does the batch floor while the cache holds them now.
    policy = floor_policy(engines=1, max_running=20, rollouts=100)
    placed = fill(policy)
    assert len(placed) == 20
    # Rollouts waiting on a tool leave the batch: as many new ones take their places.
    for rollout in placed[:5]:
        policy.track(rollout, context_tokens=150, generating=False)
    assert len(fill(policy, 20)) == 5
    # Back from the tool, they queue at the engine; nobody new comes in.
    for rollout in placed[:5]:
        policy.track(rollout, context_tokens=180, generating=True)
    assert fill(policy, 25) == []
    # The floor also needs the cache to hold the new prompt now.
    engine = placed[0].slot.engine
    assert isinstance(engine, GaugeEngine)
    engine.used = CAPACITY
    finish(policy, placed[1], 400)
    assert place(policy, 25) is None


def test_the_batch_floor_keeps_the_static_split_of_the_prompts() -> None:
    policy = floor_policy(engines=2, max_running=8, rollouts=PHASE)
    placed = [place(policy, index) for index in range(16)]
    # Rollouts 0-499 are engine 0's static share: it takes 8, the rest go where there is room.
    assert [r.slot.index for r in placed if r is not None] == [0] * 8 + [1] * 8
    for rollout in [r for r in placed if r is not None]:
        finish(policy, rollout, 300)
    assert all(load.in_engine == 0 for load in policy.loads.values())


def engines_of(policy: LiveKVPolicy, rollouts: int) -> list[int]:
    """The engine of each of the phase's rollouts the policy places now, in order."""
    placed = [place(policy, index) for index in range(rollouts)]
    return [r.slot.index for r in placed if r is not None]


def full_caches(policy: LiveKVPolicy) -> LiveKVPolicy:
    for slot in policy.slots:
        assert isinstance(slot.engine, GaugeEngine)
        slot.engine.used = CAPACITY
    return policy


def test_a_phase_that_reserves_little_cache_is_placed_at_once_as_the_static_split_does() -> None:
    # Two engines of 10,000 tokens: rollouts of 1,000 reserved tokens each are placed at once
    # up to 8.6 x 20,000 = 172,000 reserved tokens. Every rollout goes to its static engine at
    # once, whatever the forecast, the batch limit or the cache say.
    assert LiveKVPolicy.UPFRONT_RESERVATION == 8.6
    policy = full_caches(floor_policy(engines=2, max_running=8, rollouts=172))
    assert engines_of(policy, 172) == [0] * 86 + [1] * 86
    # One rollout more: the floor and the forecast decide, and a full cache takes nothing but
    # one rollout on each engine that has none.
    longer = full_caches(floor_policy(engines=2, max_running=8, rollouts=173))
    assert [r.slot.index for r in fill(longer)] == [0, 1]


def test_the_up_front_placement_counts_reserved_tokens_not_rollouts() -> None:
    # 100 rollouts of 1,000 reserved tokens are placed at once; the same 100 reserving 4,000
    # each (400,000 > 8.6 x 20,000) are left to the forecast, which takes one per empty engine.
    for reserved, expected in [(KV_TOKENS, [0] * 50 + [1] * 50), (4 * KV_TOKENS, [0, 1])]:
        slots = [EngineSlot(i, BatchEngine(f"e{i}", 8)) for i in range(2)]
        policy = full_caches(LiveKVPolicy(slots, headroom=0.1))
        policy.prepare([reserved] * 100)
        assert engines_of(policy, 100) == expected


def test_an_engine_without_a_batch_limit_is_placed_at_once_too() -> None:
    # The up-front rule reads only capacities: engines that report no batch limit (an
    # OpenAI-compatible server) get it as well.
    slots = [EngineSlot(0, BatchEngine("e0", 8)), EngineSlot(1, GaugeEngine("e1"))]
    policy = full_caches(LiveKVPolicy(slots, headroom=0.1))
    policy.prepare([KV_TOKENS] * 4)
    assert engines_of(policy, 4) == [0, 0, 1, 1]
