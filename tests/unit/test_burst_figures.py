"""burst_figures: reaction, recovery, peak lag and scale-downs of one burst, from a demo timeline."""

from __future__ import annotations

from multilane.demo.report import DemoSample, burst_figures


def sample(t: float, lag: int, processed: float) -> DemoSample:
    return DemoSample(t, lag, 1000.0, processed, 1, 2, {}, {}, "burst")


def test_figures_of_a_burst_met_after_four_seconds() -> None:
    # onset at t=10; processing reaches the input (1000/s) at t=14 and stays there
    samples = [sample(t, 50, 100.0) for t in range(0, 10)]
    samples += [sample(10 + i, 1000 * (i + 1), 100.0 + 200 * i) for i in range(4)]
    samples += [sample(t, 500, 1000.0) for t in range(14, 40)]
    events = [
        (5.0, "ScalingDecision", "scale [stabilised]: replicas 1->1, factor 2->3: ..."),
        (11.5, "ScalingDecision", "scale [shortfall]: replicas 1->2, factor 3->16: ..."),
        (12.0, "ScalingDecision", "hold [settling]: ..."),  # holds are not actions
        (13.5, "ScalingDecision", "scale [factor-follows]: replicas 2->2, factor 16->28: ..."),
        (30.0, "ScalingDecision", "scale [scale-down]: replicas 2->2, factor 16->12: scale down ..."),
        (45.0, "ScalingDecision", "scale [scale-down]: replicas 2->1, factor 12->3: scale down ..."),
    ]
    offered = [100.0] * 10 + [1000.0] * 30 + [100.0] * 10
    delivered = [100] * 10 + [1000] * 29 + [400] + [100] * 10
    f = burst_figures(samples, events, 10.0, 40.0, offered, delivered)
    assert f.reaction_s == 1.5
    assert f.recovery_s == 4.0
    assert f.peak_lag == 4000
    assert f.scale_actions == 4  # the factor-follows completes the shortfall's scale-up
    assert (f.scale_ups, f.scale_downs) == (2, 2)
    assert f.size_changes == 5
    assert f.scale_downs_in_burst == 1
    assert f.offered_rate == 1000.0
    assert 975 < f.achieved_rate < 1000  # the generator fell short in one second
    assert any("reaction" in line for line in f.lines())


def test_no_recovery_and_no_reaction_are_reported_as_such() -> None:
    samples = [sample(t, 100 * t, 100.0) for t in range(0, 30)]
    f = burst_figures(samples, [], 10.0, 30.0, [1000.0] * 30, [1000] * 30)
    assert f.reaction_s is None and f.recovery_s is None
    assert "not within the run" in "\n".join(f.lines())


def test_the_generator_clock_offset_shifts_the_rates() -> None:
    # the generator started 2 s after the demo's clock: its second 8 is the demo's second 10
    offered = [0.0] * 8 + [500.0] * 10
    f = burst_figures(
        [sample(10, 0, 0.0)], [], 10.0, 20.0, offered, [int(x) for x in offered], clock_offset_s=2.0
    )
    assert f.offered_rate == 500.0
