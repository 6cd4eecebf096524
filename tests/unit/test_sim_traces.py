"""The built-in traces stay the same seeded traces: a checksum per trace over its rates, partition
shares, service factors and onsets (seeds 1-3, 12 and 5 partitions, its own length and a 500 s
cut), recorded before the builders were folded into one (issue 25). A change of any trace, by one
record/s at one second or one onset, changes its checksum."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from multilane.sim.traces import TRACE_NAMES, Trace, make_trace

# recorded at 40adfc6 (before the one parametrised builder) by the digest below
RECORDED = {
    "batch_dumps": "9665c2fdeafcfd0e",
    "bursts": "45c2a8bf0ae108fe",
    "crowd": "a98094ebe768ede7",
    "diurnal": "a9fef71aa851033f",
    "flash_diurnal": "be7a8672153cc4b9",
    "hot_key": "cd1331a997d8fd4d",
    "ramp": "6a1445bed3516344",
    "saturated_ramp": "b90b68fe38ebc995",
    "slow_episode": "02554ebfd6c392da",
    "slowdown": "8be55ec761e5e890",
    "square_wave": "ac4b2e9204e529a8",
    "step": "5da26a67614ff376",
    "surge": "4dab3a5ea6160d97",
    "uneven_partitions": "3543be3a65924970",
}


def _digest(trace: Trace) -> str:
    h = hashlib.sha256()
    h.update(trace.name.encode())
    for values in (trace.rate, trace.shares, trace.service_factor):
        h.update(values.astype("<f8").tobytes())
    h.update(json.dumps([trace.event_time_s, list(trace.events)]).encode())
    return h.hexdigest()[:16]


def _checksum(name: str) -> str:
    parts = {
        f"{name}/{seed}/{partitions}": _digest(make_trace(name, None, partitions, seed))
        for seed in (1, 2, 3)
        for partitions in (12, 5)
    }
    parts[f"{name}/short"] = _digest(make_trace(name, 500, 12, 7))
    return hashlib.sha256("".join(parts[k] for k in sorted(parts)).encode()).hexdigest()[:16]


def test_every_built_in_trace_is_recorded() -> None:
    assert set(TRACE_NAMES) == set(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_built_in_trace_unchanged(name: str) -> None:
    assert _checksum(name) == RECORDED[name]


def test_the_checksum_sees_one_changed_second() -> None:
    trace = make_trace("crowd", None, 12, 1)
    rate = trace.rate.copy()
    rate[1234] += 1.0
    changed = Trace(trace.name, rate, trace.shares, trace.service_factor, trace.event_time_s, trace.events)
    assert _digest(changed) != _digest(trace)
    moved = Trace(trace.name, trace.rate, trace.shares, trace.service_factor, None, trace.events[1:])
    assert _digest(moved) != _digest(trace)
    assert np.array_equal(make_trace("crowd", None, 12, 1).rate, trace.rate)
