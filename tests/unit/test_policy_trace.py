"""The policy returns what it found: a typed DecisionTrace, no back-channel (issue 23, item 5)."""

from __future__ import annotations

import ast
from pathlib import Path

from multilane.operator.decision.policy import (
    AutoscalePolicy,
    DecisionTrace,
    Observation,
    PolicyConfig,
    PolicyState,
)

DECISION = Path(__file__).resolve().parents[2] / "multilane" / "operator" / "decision"


def _obs(
    now: float, lag: int, rate: float = 1000.0, processing: float = 1000.0, factor: int = 4
) -> Observation:
    per = lag // 12
    return Observation(
        now=now,
        lag_by_partition={p: per for p in range(12)},
        input_rate=rate,
        processing_rate=processing,
        replicas=1,
        factor=factor,
        busy_lanes=processing / 100.0,
    )


def test_decision_carries_a_typed_trace_whose_flat_form_is_the_inputs() -> None:
    policy = AutoscalePolicy(PolicyConfig(partitions=12, max_replicas=6, max_factor=16))
    state = PolicyState()
    _, state = policy.decide(_obs(0, 500), state)
    d, _ = policy.decide(_obs(15, 60_000, rate=3000), state)
    assert isinstance(d.trace, DecisionTrace)
    assert d.trace.shortfall and d.trace.lag_rising
    assert d.inputs == d.trace.as_inputs()
    assert d.warnings == list(d.trace.warnings)
    assert d.trace.recommended_factor == d.inputs["recommended_factor"]


def test_bottleneck_cap_is_a_typed_field_not_a_dict_key_written_by_a_rule() -> None:
    """A scale-up that does not raise the processing rate: the cap shows in the trace's own field."""
    policy = AutoscalePolicy(PolicyConfig(partitions=12, max_replicas=6, max_factor=16))
    state = PolicyState()
    size = (1, 4)
    capped = None
    for i, lag in enumerate([500, 200_000, 400_000, 600_000, 800_000, 1_000_000, 1_200_000, 1_400_000]):
        o = Observation(
            now=15.0 * i,
            lag_by_partition={p: lag // 12 for p in range(12)},
            input_rate=3000.0,
            processing_rate=2000.0,
            replicas=size[0],
            factor=size[1],
            busy_lanes=20.0 * size[1] / 4,
        )
        d, state = policy.decide(o, state)
        size = (d.replicas, d.factor)
        assert d.trace is not None
        if d.trace.capped_by_bottleneck is not None:
            capped = d
    assert capped is not None and capped.trace is not None
    assert capped.inputs["capped_by_bottleneck"] == capped.trace.capped_by_bottleneck
    assert any("did not raise the processing rate" in w for w in capped.trace.warnings)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_import_circle_between_damping_and_explain() -> None:
    assert not any(
        m.startswith("multilane.operator.decision.damping") for m in _imports(DECISION / "explain.py")
    )


def test_no_rule_takes_a_dict_or_list_to_fill() -> None:
    """No ``inputs`` dict and no ``warnings`` list is passed into a rule."""
    tree = ast.parse((DECISION / "damping.py").read_text())
    params = {a.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for a in node.args.args}
    assert "inputs" not in params and "warnings" not in params
