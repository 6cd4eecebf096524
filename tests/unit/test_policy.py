"""Unit tests of the autoscaling policy (pure)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.operator.decision.policy import (
    AutoscalePolicy,
    Decision,
    Observation,
    PolicyConfig,
    PolicyState,
    estimate_lane_rate,
    needed_capacity,
    recommend,
)

LANE_RATE = 100.0  # records/s of one busy lane in these tests


def obs(
    now: float,
    *,
    lag: int = 0,
    input_rate: float = 3000.0,
    processing_rate: float | None = None,
    replicas: int = 1,
    factor: int = 4,
    partitions: int = 12,
    busy: float | None = -1.0,
) -> Observation:
    """An observation with the lag spread evenly; busy lanes follow from the processing rate."""
    rate = input_rate if processing_rate is None else processing_rate
    per = lag // partitions
    lags = {p: per for p in range(partitions)}
    lags[0] += lag - per * partitions
    busy_lanes = rate / LANE_RATE if busy == -1.0 else busy
    return Observation(
        now=now,
        lag_by_partition=lags,
        input_rate=input_rate,
        processing_rate=rate,
        replicas=replicas,
        factor=factor,
        busy_lanes=busy_lanes,
    )


def run(policy: AutoscalePolicy, observations: list[Observation], follow: bool = True) -> list[Decision]:
    """Decide on each observation in turn; with ``follow`` the size of every observation after the
    first is the previous decision's (the operator applied it)."""
    state = PolicyState()
    out: list[Decision] = []
    for o in observations:
        if follow and out:
            o = replace(o, replicas=out[-1].replicas, factor=out[-1].factor)
        d, state = policy.decide(o, state)
        # the state must survive a JSON round trip at every step (the operator stores it in status)
        state = PolicyState.from_dict(json.loads(json.dumps(state.to_dict())))
        out.append(d)
    return out


CFG = PolicyConfig(partitions=12, max_replicas=6, max_factor=16, scale_down_delay_s=300, stabilisation_s=60)


@dataclass
class Case:
    name: str
    config: PolicyConfig
    observations: list[Observation]
    expect: tuple[int, int]  # (replicas, factor) of the last decision
    reason_contains: str
    warning_contains: str | None = None
    follow: bool = True


def _steady() -> list[Observation]:
    # 3000 rec/s at 0.7 utilisation -> 4286 rec/s -> 43 lanes -> F=4 over 12 partitions, 1 pod.
    return [obs(t, lag=500) for t in range(0, 600, 15)]


def _backlog() -> list[Observation]:
    # Steady, then a backlog of 600k that grew since the previous look: +2000 rec/s of catch-up ->
    # 63 lanes -> F=6 (72 lanes on one pod exceed the 64-lane budget -> 2 pods of 6 partitions).
    return [obs(t, lag=500) for t in range(0, 60, 15)] + [obs(60, lag=600_000, processing_rate=3000)]


def _noise_spike() -> list[Observation]:
    # steady, then one noisy sample of double input without lag growth: the window holds it back.
    return [obs(t, lag=500) for t in range(0, 300, 15)] + [obs(300, lag=500, input_rate=6000)]


def _draining() -> list[Observation]:
    # 2x8 running, the input fell to 1000 rec/s, a backlog is falling: no scale-down even past the delay.
    return [
        obs(t, lag=400_000 - 1000 * t, input_rate=1000, processing_rate=4000, replicas=2, factor=8)
        for t in range(0, 390, 15)
    ]


def _bad(kind: str) -> list[Observation]:
    good = obs(0, lag=500)
    if kind == "negative lag":
        bad = Observation(15, {p: -5 for p in range(12)}, 3000, 3000, 1, 4, 30)
    elif kind == "nan rate":
        bad = Observation(15, dict(good.lag_by_partition), math.nan, 3000, 1, 4, 30)
    else:
        bad = Observation(15, {0: 10}, 3000, 3000, 1, 4, 30)
    # the bad observation also claims a different current size: the policy holds its last decision
    bad = Observation(
        bad.now, bad.lag_by_partition, bad.input_rate, bad.processing_rate, 5, 9, bad.busy_lanes
    )
    return [good, bad]


CASES = [
    Case("steady state holds", CFG, _steady(), (1, 4), "at the recommendation"),
    # the factor first: 5 is what one pod carries within its 64-lane budget until the second is ready
    Case("backlog scales up within bounds", CFG, _backlog(), (2, 5), "lag is rising"),
    Case("a single noisy sample waits for stabilisation", CFG, _noise_spike(), (1, 4), "stabilisation"),
    Case("no scale-down while draining", CFG, _draining(), (2, 8), "draining"),
    Case(
        "demand above the maximum clamps and warns",
        CFG,
        [obs(0, lag=10_000_000, input_rate=50_000, processing_rate=4000, factor=4)],
        (3, 5),  # then 16 once the 3 pods run: 4 partitions x 16 lanes = 64 lanes per pod
        "scale up",
        "exceeds the maximum capacity",
    ),
    Case(
        "replicas never above partitions",
        PolicyConfig(partitions=4, max_replicas=10, max_factor=64, max_lanes_per_replica=2),
        [obs(0, lag=0, input_rate=20_000, processing_rate=400, partitions=4, factor=1)],
        (4, 1),  # 64 once the 4 pods run (one pod's 2-lane budget holds factor 1 meanwhile)
        "scale up",
        "exceed max_lanes_per_replica",
    ),
    Case(
        "current size outside new bounds is clamped",
        PolicyConfig(partitions=12, min_replicas=2, max_replicas=6, min_factor=2, max_factor=16),
        [obs(0, lag=500, replicas=9, factor=1, input_rate=100)],
        (6, 2),
        "clamp 9x1 into bounds -> 6x2",
    ),
    Case(
        "negative lag holds",
        CFG,
        _bad("negative lag"),
        (1, 4),
        "invalid observation: invalid lag",
        follow=False,
    ),
    Case("NaN rate holds", CFG, _bad("nan rate"), (1, 4), "invalid input_rate nan", follow=False),
    Case(
        "missing partitions hold", CFG, _bad("missing"), (1, 4), "no lag for partitions [1, 2", follow=False
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_policy_cases(case: Case) -> None:
    decisions = run(AutoscalePolicy(case.config), case.observations, follow=case.follow)
    last = decisions[-1]
    assert (last.replicas, last.factor) == case.expect, last.reason
    assert case.reason_contains in last.reason
    if case.warning_contains is not None:
        assert any(case.warning_contains in w for w in last.warnings), last.warnings
    for d in decisions:
        assert d.reason
        assert d.inputs
        assert 1 <= d.replicas <= min(case.config.max_replicas, case.config.partitions)
        assert case.config.min_factor <= d.factor <= case.config.max_factor


def test_scale_down_waits_for_the_delay_and_goes_to_the_window_max() -> None:
    policy = AutoscalePolicy(CFG)
    state = PolicyState()
    size = (2, 8)
    decisions: list[tuple[float, Decision]] = []
    # input falls from 3000 to 1000 rec/s at t=0, then at t=200 rises to 2000 for one sample (window max)
    for t in range(0, 900, 15):
        rate = 2000.0 if t == 195 else 1000.0
        d, state = policy.decide(obs(t, lag=100, input_rate=rate, replicas=size[0], factor=size[1]), state)
        decisions.append((t, d))
        size = (d.replicas, d.factor)
    first_down = next((t, d) for t, d in decisions if d.changed)
    t_down, d_down = first_down
    assert t_down >= CFG.scale_down_delay_s
    # at t_down the window still holds the 2000 rec/s sample: 2857 rec/s -> 29 lanes -> F=3
    assert (d_down.replicas, d_down.factor) == (1, 3), d_down.reason
    assert "highest recommendation" in d_down.reason
    # once the sample leaves the window, down again to 1000/0.7 -> 15 lanes -> F=2
    final = decisions[-1][1]
    assert (final.replicas, final.factor) == (1, 2)
    changes = [t for t, d in decisions if d.changed]
    assert changes[1] - changes[0] >= CFG.scale_down_delay_s


def test_scale_down_happens_on_a_free_running_clock() -> None:
    # observations at irregular times (never on a grid of the interval): scale-down must still come
    policy = AutoscalePolicy(CFG)
    state = PolicyState()
    size = (2, 8)
    t = 0.37
    first_down: float | None = None
    while t < 900:
        d, state = policy.decide(obs(t, lag=100, input_rate=1000, replicas=size[0], factor=size[1]), state)
        if d.changed and first_down is None:
            first_down = t
        size = (d.replicas, d.factor)
        t += 15.0 + 0.013 * (int(t) % 7)
    assert first_down is not None, "never scaled down"
    assert CFG.scale_down_delay_s <= first_down <= CFG.scale_down_delay_s + 2 * 16
    assert size == (1, 2)


def test_ineffective_scale_up_is_detected_and_further_scale_up_held() -> None:
    config = PolicyConfig(partitions=12, max_replicas=12, max_factor=256)
    policy = AutoscalePolicy(config)
    state = PolicyState()
    size = (1, 4)
    decisions: list[tuple[int, Decision]] = []
    lag = 100_000
    # a downstream limit caps processing at 2000 rec/s whatever the lane count; the lag keeps growing
    for t in range(0, 1200, 15):
        lag += 1000 * 15
        busy = float(12 * size[1])  # every lane busy, each slower as lanes are added
        d, state = policy.decide(
            obs(
                t, lag=lag, input_rate=3000, processing_rate=2000, replicas=size[0], factor=size[1], busy=busy
            ),
            state,
        )
        decisions.append((t, d))
        size = (d.replicas, d.factor)
    flagged = [
        (t, d) for t, d in decisions if any("did not raise the processing rate" in w for w in d.warnings)
    ]
    assert flagged, "the ineffective scale-up was not reported"
    t_flag = flagged[0][0]
    ups = [(t, d) for t, d in decisions if d.changed and t < t_flag]
    assert ups, "no scale-up before the detection"
    # the scale-up that proved ineffective: its first decision (the factor then followed its pods)
    before = next(d for _, d in reversed(ups) if d.rule != "factor-follows").inputs["current_factor"]
    retry_at = t_flag + config.bottleneck_retry_s
    held = [d for t, d in decisions if t_flag <= t < retry_at]
    # never scaled up again until the retry; the recommendation is capped at the size before the
    # ineffective scale-up, and after the scale-down delay the useless lanes are given back
    assert all(d.factor <= ups[-1][1].factor for d in held)
    assert all(d.inputs["recommended_factor"] <= before for d in held)
    assert "bottleneck" in held[0].reason
    assert held[-1].factor == before < ups[-1][1].factor, held[-1].reason
    # after bottleneck_retry_s one probe is tried, at most twice the last effective size
    retried = [d for t, d in decisions if t >= retry_at and d.changed]
    assert retried and before < retried[0].factor <= 2 * before
    # it fails too: the hold doubles
    assert state.bottleneck is not None and state.bottleneck_strikes == 1
    assert state.bottleneck_hold_until is not None
    assert state.bottleneck_hold_until >= retry_at + 2 * config.bottleneck_retry_s


def test_bottleneck_clears_when_the_rate_rises() -> None:
    policy = AutoscalePolicy(CFG)
    state = PolicyState()
    for t in range(0, 60, 15):
        d, state = policy.decide(obs(t, lag=500), state)
    d, state = policy.decide(obs(60, lag=200_000, processing_rate=2000, busy=48), state)
    assert d.changed
    size = {"replicas": d.replicas, "factor": d.factor}
    d, state = policy.decide(obs(135, lag=400_000, processing_rate=2000, busy=12.0 * d.factor, **size), state)
    assert state.bottleneck is not None
    assert any("did not raise the processing rate" in w for w in d.warnings)
    d, state = policy.decide(obs(150, lag=400_000, processing_rate=4000, busy=40, **size), state)
    assert state.bottleneck is None


def test_hot_partition_raises_the_factor() -> None:
    # 1200 rec/s in total needs 1200/0.7 = 1715 rec/s -> 18 lanes -> F=2 when spread evenly,
    # but partition 0 receives 600 rec/s alone: 600/0.7 = 857 rec/s -> 9 lanes on that partition.
    by_p = {p: (600.0 if p == 0 else 600.0 / 11) for p in range(12)}
    o = replace(obs(0, lag=0, input_rate=1200, factor=1), input_rate_by_partition=by_p)
    d, _ = AutoscalePolicy(CFG).decide(o, PolicyState())
    assert d.inputs["recommended_factor"] == 9, d.reason
    assert d.inputs["hottest_partition_rate"] == pytest.approx(600 / 0.7, rel=1e-3)
    even, _ = AutoscalePolicy(CFG).decide(obs(0, lag=0, input_rate=1200, factor=1), PolicyState())
    assert even.inputs["recommended_factor"] == 2
    # a backlog on one partition alone also counts: 300k on partition 0 -> +1000 rec/s there
    lags = {p: 0 for p in range(12)}
    lags[0] = 300_000
    o = replace(obs(0, lag=0, input_rate=1200, factor=1), lag_by_partition=lags)
    d, _ = AutoscalePolicy(CFG).decide(o, PolicyState())
    assert d.inputs["recommended_factor"] == math.ceil((100 / 0.7 + 1000) / LANE_RATE)


def test_cpu_bound_pods_add_replicas() -> None:
    # one pod at 95 % CPU processes 285 rec/s: a pod handles 300 rec/s at 100 %. The input is 900
    # rec/s: the mean would need ceil(900 / (300 x 0.7)) = 5 pods, but 5 pods on 12 partitions give
    # the busiest pod 3 partitions (225 rec/s > 210): 6 pods (2 each, 150 rec/s). Lanes alone would
    # keep 1 pod. (Issue 25: size for the busiest pod, ceil(P/R).)
    o = replace(obs(0, lag=0, input_rate=900, processing_rate=285, factor=1), cpu_utilisation=0.95)
    d, state = AutoscalePolicy(CFG).decide(o, PolicyState())
    assert d.replicas == 6, d.reason
    assert d.inputs["pod_rate"] == pytest.approx(300)
    assert state.pod_rate == pytest.approx(300)
    without_cpu, _ = AutoscalePolicy(CFG).decide(replace(o, cpu_utilisation=None), PolicyState())
    assert without_cpu.replicas == 1
    # not enough partitions for the CPU needed: capped at min(max_replicas, partitions), with a warning
    o = replace(obs(0, lag=0, input_rate=6000, processing_rate=285, factor=1), cpu_utilisation=0.95)
    d, _ = AutoscalePolicy(CFG).decide(o, PolicyState())
    assert d.replicas == CFG.replica_ceiling
    assert any(w.startswith("CPU:") for w in d.warnings)


def test_scale_up_is_judged_only_after_the_rollout() -> None:
    policy = AutoscalePolicy(CFG)
    state = PolicyState()
    for t in range(0, 60, 15):
        _, state = policy.decide(obs(t, lag=500), state)
    d, state = policy.decide(obs(60, lag=200_000, processing_rate=2000, busy=48), state)
    size = {"replicas": d.replicas, "factor": d.factor}
    o = replace(obs(135, lag=400_000, processing_rate=2000, busy=12.0 * d.factor, **size), rebalancing=True)
    d, state = policy.decide(o, state)
    assert state.bottleneck is None
    assert state.pending_scale_up is not None
    o = replace(o, replicas=d.replicas, factor=d.factor)  # the operator applied the decision
    d, state = policy.decide(replace(o, now=150, rebalancing=False), state)
    assert state.bottleneck is not None


def test_lane_rate_sources() -> None:
    o = obs(0, lag=0, processing_rate=3000, busy=30)
    assert estimate_lane_rate(o, CFG, None).source == "observed"
    assert estimate_lane_rate(o, CFG, None).rate == pytest.approx(100)
    o = obs(0, lag=500_000, processing_rate=4800, busy=None)
    est = estimate_lane_rate(o, CFG, None)
    assert (est.source, est.rate) == ("saturated", pytest.approx(100))
    o = obs(0, lag=0, processing_rate=3000, busy=None)
    assert estimate_lane_rate(o, CFG, 42.0).rate == 42.0
    assert estimate_lane_rate(o, CFG, None).source == "default"
    d, _ = AutoscalePolicy(CFG).decide(o, PolicyState())
    assert any("default_lane_rate" in w for w in d.warnings)
    assert d.inputs["lane_rate_source"] == "default"


def test_max_lag_adds_capacity() -> None:
    base = PolicyConfig(partitions=12)
    bounded = PolicyConfig(partitions=12, max_lag=10_000, max_lag_catchup_s=60)
    assert needed_capacity(bounded, 1000, 100_000) > needed_capacity(base, 1000, 100_000)
    assert needed_capacity(bounded, 1000, 100_000) >= 1000 + 90_000 / 60
    assert needed_capacity(bounded, 1000, 5_000) == needed_capacity(base, 1000, 5_000)


def test_state_json_round_trip() -> None:
    _, state = AutoscalePolicy(CFG).decide(obs(0, lag=10_000), PolicyState())
    text = json.dumps(state.to_dict())
    assert PolicyState.from_dict(json.loads(text)) == state
    assert PolicyState.from_dict(None) == PolicyState()


def test_invalid_config_rejected() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        PolicyConfig(partitions=4, min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="target_utilisation"):
        PolicyConfig(partitions=4, target_utilisation=0)


# --- properties ---------------------------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> PolicyConfig:
    partitions = draw(st.integers(1, 64))
    min_r = draw(st.integers(1, 8))
    min_f = draw(st.integers(1, 8))
    return PolicyConfig(
        partitions=partitions,
        min_replicas=min_r,
        max_replicas=draw(st.integers(min_r, 32)),
        min_factor=min_f,
        max_factor=draw(st.integers(min_f, 128)),
        target_catchup_s=draw(st.floats(1, 3600)),
        max_lag=draw(st.none() | st.integers(1, 10**7)),
        target_utilisation=draw(st.floats(0.05, 1.0)),
        max_lanes_per_replica=draw(st.integers(1, 256)),
        default_lane_rate=draw(st.floats(0.1, 1e4)),
    )


@st.composite
def observations(draw: st.DrawFn, config: PolicyConfig) -> Observation:
    lags = {p: draw(st.integers(0, 10**7)) for p in range(config.partitions)}
    busy = draw(st.none() | st.floats(0, 10_000))
    return Observation(
        now=draw(st.floats(0, 1e6)),
        lag_by_partition=lags,
        input_rate=draw(st.floats(0, 1e6)),
        processing_rate=draw(st.floats(0, 1e6)),
        replicas=draw(st.integers(0, 40)),
        factor=draw(st.integers(1, 200)),
        busy_lanes=busy,
    )


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_property_bounds_and_capacity(data: st.DataObject) -> None:
    config = data.draw(configs())
    o = data.draw(observations(config))
    d, _ = AutoscalePolicy(config).decide(o, PolicyState())
    assert config.replica_floor <= d.replicas <= config.replica_ceiling <= config.partitions
    assert config.min_factor <= d.factor <= config.max_factor
    rate = estimate_lane_rate(o, config, None).rate
    needed = needed_capacity(config, o.input_rate, sum(o.lag_by_partition.values()))
    # the recommendation covers the need; the factor run now is that, or, while pods are added,
    # what the running pods carry within their lane budget (never less than before)
    recommended = d.inputs["recommended_factor"]
    if config.partitions * config.max_factor * rate >= needed:
        assert config.partitions * recommended * rate >= needed, d.reason
    else:
        assert recommended == config.max_factor, d.reason
        assert any("exceeds the maximum capacity" in w for w in d.warnings)
    if d.changed and d.factor < recommended:
        ready = o.replicas
        assert d.replicas > ready >= 1, d.reason
        assert d.factor >= min(o.factor, recommended)
        share = -(-config.partitions // ready)
        assert d.factor <= max(config.max_lanes_per_replica // share, config.min_factor, o.factor)


@settings(max_examples=100, deadline=None)
@given(config=configs(), needed=st.floats(0, 1e7), rate=st.floats(0.01, 1e5))
def test_property_recommend_rounds_up(config: PolicyConfig, needed: float, rate: float) -> None:
    rec = recommend(config, needed, rate)
    if config.partitions * config.max_factor * rate >= needed:
        assert rec.capacity >= needed
        # never more than one factor step above what is needed (unless the minimum forces it)
        if rec.factor > config.min_factor:
            assert config.partitions * (rec.factor - 1) * rate < needed
    assert rec.replicas <= config.partitions


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_property_sequences_stay_in_bounds(data: st.DataObject) -> None:
    config = data.draw(configs())
    policy = AutoscalePolicy(config)
    state = PolicyState()
    now = 0.0
    r, f = config.replica_floor, config.min_factor
    for _ in range(data.draw(st.integers(1, 20))):
        o = data.draw(observations(config))
        now += data.draw(st.floats(1, 120))
        o = Observation(now, o.lag_by_partition, o.input_rate, o.processing_rate, r, f, o.busy_lanes)
        d, state = policy.decide(o, state)
        state = PolicyState.from_dict(json.loads(json.dumps(state.to_dict())))
        assert config.replica_floor <= d.replicas <= config.replica_ceiling
        assert config.min_factor <= d.factor <= config.max_factor
        r, f = d.replicas, d.factor
