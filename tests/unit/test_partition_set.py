"""``PartitionSet`` is the only writer of the partition sets (read from the source), and keeps them
consistent with each other and with the flow bound."""

from __future__ import annotations

import ast
import asyncio
from dataclasses import dataclass
from pathlib import Path

from multilane.worker.flow import FlowController
from multilane.worker.partition import Phase
from multilane.worker.partition_set import PartitionSet

ROOT = Path(__file__).resolve().parents[2] / "multilane"
OWNER = ROOT / "worker" / "partition_set.py"
SCANNED = [p for p in (ROOT / "worker").glob("*.py") if p != OWNER]
"""The engine's modules (the state store below them keeps sets of its own, e.g. its ``_closing``)."""
FIELDS = {"_parts", "_opening", "_closing", "_reopen_pending", "_released_processed", "_released_total"}
"""The fields PartitionSet owns (and the engine's old name of the released count)."""
SHARED = {"runtimes"}
"""PartitionSet's read-only views: nobody may write through them."""
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "add", "discard", "remove",
            "difference_update", "intersection_update", "symmetric_difference_update", "__setitem__",
            "__delitem__"}


def _attr_name(node: ast.AST) -> str | None:
    """``x.name`` or ``x.name[...]`` -> ``name``."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return node.attr if isinstance(node, ast.Attribute) else None


def _keeps_a_reference(node: ast.Assign, inits: set[int]) -> bool:
    """``self.name = value`` inside an ``__init__``: a class storing the set it is handed (the fetch
    loop keeps ``runtimes``), not a write into it."""
    return id(node) in inits and all(
        isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
        for t in node.targets
    )


def writes_of(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Lines that assign, delete or mutate an attribute whose name is in ``names``."""
    inits = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__init__"
             for n in ast.walk(f)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            if _keeps_a_reference(node, inits):
                continue
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATORS:
            targets = [node.func.value]
        for t in targets:
            for sub in ast.walk(t) if isinstance(t, ast.Tuple) else [t]:
                name = _attr_name(sub)
                if name in names:
                    found.append((node.lineno, name))
    return found


def test_only_the_partition_set_writes_its_fields() -> None:
    offenders = {}
    for path in SCANNED:
        bad = writes_of(ast.parse(path.read_text(), str(path)), FIELDS | SHARED)
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders, f"written outside PartitionSet: {offenders}"


def test_the_scan_sees_writes() -> None:
    code = (
        "a._parts[k] = v\nb._opening.add(tp)\ndel c._closing[tp]\nd._released_total += 1\n"
        "e.partitions.runtimes.pop(tp)\nf._reopen_pending.difference_update(x)\nprint(g._parts.get(tp))\n"
        "class C:\n    def __init__(self, parts):\n        self._parts = parts\n"
        "    def f(self):\n        self._parts = {}\n"
    )
    lines = sorted(line for line, _ in writes_of(ast.parse(code), FIELDS | SHARED))
    assert lines == [1, 2, 3, 4, 5, 6, 12]


@dataclass(eq=False)
class FakePart:
    topic: str
    partition: int
    processed: int = 0
    phase: Phase = Phase.ACTIVE


def test_add_and_forget_keep_the_flow_bound_and_the_processed_count() -> None:
    flow = FlowController(1000, 1 << 20, 0, 0, 0.5)
    ps = PartitionSet(flow)
    a, b = FakePart("t", 0, processed=5), FakePart("t", 1, processed=7, phase=Phase.RELEASING)
    ps.add(a)  # type: ignore[arg-type]
    ps.add(b)  # type: ignore[arg-type]
    assert len(ps) == 2 and ("t", 0) in ps and ps.active() == [a]
    assert flow.part_max_records == 500  # the fair share of two partitions
    assert ps.processed_total() == 12
    ps.forget(a)  # type: ignore[arg-type]
    ps.forget(a)  # type: ignore[arg-type]  # forgetting twice counts once
    assert ("t", 0) not in ps and ps.processed_total() == 12
    assert ps.owned() == [b] and ps.owned([("t", 0), ("t", 1)]) == [b]
    assert flow.part_max_records == 1000


def test_opening_closing_and_reopen_pending() -> None:
    ps = PartitionSet(FlowController(1000, 1 << 20, 0, 0, 0.5))
    ps.start_opening([("t", 1), ("t", 0)])
    assert ps.opening() == [("t", 0), ("t", 1)]
    ps.end_opening([("t", 1)])
    assert ps.opening() == [("t", 0)]

    loop = asyncio.new_event_loop()
    try:
        fut: asyncio.Future[None] = loop.create_future()
        ps.closing_started(("t", 2), fut)
        assert ps.all_closing() == [("t", 2)]
        assert ps.take_closing([("t", 2), ("t", 3)]) == [fut]
        assert ps.take_closing([("t", 2)]) == [] and ps.all_closing() == []
    finally:
        loop.close()

    ps.mark_reopen_pending(("t", 4))
    ps.mark_reopen_pending(("t", 5))
    ps.settle([("t", 4)])
    assert not ps.reopen_pending(("t", 4)) and ps.reopen_pending(("t", 5))
    ps.settle()
    assert not ps.reopen_pending(("t", 5))
