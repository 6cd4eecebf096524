"""burst: a 10x step burst through the real kopf operator,
with a real ``multilane worker`` per pod, on 4 partitions -- the shape of ``benchmarks/burst.py``'s
4-partition row, shortened (a 10 s burst). The driver is :mod:`benchmarks.k8s_burst`, which
the benchmark's ``operator`` variant runs too; the figures are computed as the local plane's.

Asserts that the operator reacted (a scale-up decision after the onset), that processing recovered to
95 % of the input within the run, and that nothing was lost: every delivery checker, and the state
restored from the changelogs equal to the reference counts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.k8s_burst import BurstShape, run_operator_burst
from multilane.testing.broker import EmbeddedBroker
from tests.operator.conftest import CRD_PATH

pytestmark = pytest.mark.broker

PARTITIONS = 4
# benchmarks/burst.py RATES[4]: a lull of 150 rec/s and a burst of 1,500 rec/s, 50 ms of I/O per record
SHAPE = BurstShape(lull=150.0, burst=1500.0, warm_s=6.0, burst_s=10.0, tail_s=6.0, sleep_ms=50.0)
_SIZE = re.compile(r"replicas (\d+)->(\d+), factor (\d+)->(\d+)")


def capacity_change(message: str) -> int:
    """replicas x factor after minus before, from a ScalingDecision message ("scale [rule]: replicas
    1->2, factor 2->8: ...")."""
    m = _SIZE.search(message)
    assert m is not None, message
    r0, r1, f0, f1 = (int(x) for x in m.groups())
    return r1 * f1 - r0 * f0


def test_capacity_change_reads_the_decision_message() -> None:
    assert capacity_change("scale [shortfall]: replicas 1->2, factor 2->8: lag rising") == 14
    assert capacity_change("scale [idle]: replicas 3->1, factor 8->8: idle") == -16


@pytest.mark.asyncio(loop_scope="function")
async def test_burst_through_the_operator(broker: EmbeddedBroker, topic_name: str, tmp_path: Path) -> None:
    broker.create_topic(topic_name, PARTITIONS)
    run = await run_operator_burst(broker.bootstrap, topic_name, PARTITIONS, tmp_path, SHAPE, CRD_PATH)
    f = run.figures
    print("\n".join(["burst through the operator:", *f.lines()]))
    decisions = [(t, m) for t, reason, m in run.timeline.events if reason == "ScalingDecision"]
    for t, m in decisions:
        print(f"  t={t:5.1f}s {m[:140]}")
    # The operator reacted: a scale-up decision after the onset, and the pods and factor followed.
    ups = [t for t, m in decisions if t >= f.onset_s and capacity_change(m) > 0]
    assert ups, f"no scale-up after the onset at {f.onset_s:.1f}s: {decisions}"
    assert f.reaction_s is not None and f.reaction_s <= ups[0] - f.onset_s + 1e-9
    assert run.peak_replicas * run.peak_factor > 2, (run.peak_replicas, run.peak_factor)
    # It recovered within the run: processing >= 95 % of the burst's input for 3 s.
    assert f.recovery_s is not None, [(s.t, s.processing_rate, s.lag) for s in run.timeline.samples]
    assert f.achieved_rate > 0.8 * f.offered_rate, "the load generator fell behind: not a 10x burst"
    # Nothing lost: every delivery checker, state equal to the reference.
    v = run.verdict
    problems = [str(c) for c in v.checks if not c.ok]
    assert v.lost == 0, f"lost {v.lost} records; {problems}"
    assert not problems, "\n".join(problems)
    assert v.state_ok, v.state_detail
    assert v.processed == v.produced > 0
