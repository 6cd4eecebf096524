"""The simulator agrees with the burst benchmark on real workers (multilane.sim.calibration)."""

from __future__ import annotations

import pytest

from multilane.sim.calibration import MEASURED, TOLERANCE, mean_burst_response
from multilane.sim.model import SimConfig


@pytest.mark.parametrize(
    ("base", "burst_s", "prefix"),
    [(120.0, 36.0, ""), (150.0, 20.0, "quick_")],  # the demo's burst; the quick benchmark's
)
def test_simulated_burst_matches_the_measured_reaction_and_recovery(
    base: float, burst_s: float, prefix: str
) -> None:
    sim = mean_burst_response(base=base, burst_s=burst_s)
    assert sim.reaction_s is not None and sim.recovery_s is not None
    for key, value in (("reaction_s", sim.reaction_s), ("recovery_s", sim.recovery_s)):
        measured = MEASURED[prefix + key].value
        assert abs(value - measured) <= TOLERANCE[key], (key, value, measured)
    # the peak lag is of the same order (not held tighter: the sampled lag of the real run includes
    # the records in flight and the sampling phase)
    assert 0.5 <= sim.peak_lag / MEASURED[prefix + "peak_lag"].value <= 2.0


def test_simulator_defaults_are_the_measured_costs() -> None:
    sim = SimConfig()
    assert sim.handoff_pause_s == MEASURED["handoff_pause_s"].value
    assert sim.move_warmup_s == MEASURED["move_warmup_s"].value
    assert sim.pod_start_s == MEASURED["pod_start_s"].value
    assert all(m.source for m in MEASURED.values())
