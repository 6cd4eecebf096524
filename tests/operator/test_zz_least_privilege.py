"""Least privilege, enforced: every (API group, resource, verb) the chart's rendered Roles and
ClusterRoles grant was needed by some scenario of this directory, and no scenario was refused.

Every emulated API server of ``tests/operator`` authorizes against the chart's RBAC (the ``rbac``
session fixture, ``conftest.py``) and records which rule allowed each request. This module runs last
(its name sorts last) and reads that record; run alone, or with part of the directory deselected, it
skips (the record would be incomplete). Under ``pytest -n N`` each worker holds only its part of the
record, so the two checks run on the xdist controller once every worker has finished, on the merged
record (``tests/support/after_workers.py``). Scenarios marked ``slow`` do not count: the default suite must
use every rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from multilane.testing.kube_rbac import RuleUsage, granted_triples, unused_grants
from tests.operator.conftest import RbacSession
from tests.support.after_workers import Record, after_workers

HERE = Path(__file__).resolve().parent


def _only_slow(path: Path) -> bool:
    """Every test of the module is marked ``slow`` (itself or by its ``pytestmark``): the default suite
    runs none of it, so it cannot be what makes the record incomplete there."""
    tree = ast.parse(path.read_text())
    if any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and "slow" in ast.unparse(node.value)
        for node in tree.body
    ):
        return True
    tests = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    ]
    return bool(tests) and all(
        any(ast.unparse(d) == "pytest.mark.slow" for d in node.decorator_list) for node in tests
    )


def _modules_not_collected(collected: set[str]) -> list[str]:
    """Test modules of this directory with no test among ``collected`` node ids (empty: all collected).
    A module whose every test is ``slow`` does not count: the default suite must use every rule
    without it."""
    names = {Path(nodeid.split("::", 1)[0]).name for nodeid in collected}
    return sorted(
        p.name
        for p in HERE.glob("test_*.py")
        if p.name != Path(__file__).name and p.name not in names and not _only_slow(p)
    )


def _record(rbac: RbacSession, session: pytest.Session) -> Record:
    """The session's record, when it ran serially (under xdist the controller merges the workers')."""
    return Record(
        collected={item.nodeid for item in session.items},
        manifests=rbac.manifests,
        used=dict(rbac.usage.used),
        denied=list(rbac.usage.denied),
        scenarios=set(rbac.scenarios),
    )


def _skip_unless_whole_directory(record: Record) -> None:
    missing = _modules_not_collected(record.collected)
    if missing:
        pytest.skip(f"needs every scenario of tests/operator in the session; not collected: {missing}")


def every_granted_rule_used(record: Record) -> None:
    _skip_unless_whole_directory(record)
    assert record.scenarios, "no scenario ran under the chart's RBAC"
    assert granted_triples(record.manifests), "the chart renders no rule"
    unused = unused_grants(record.manifests, RuleUsage(used=dict(record.used)))
    assert unused == [], "granted by the chart, needed by no scenario (remove them):\n" + "\n".join(
        f"  {role} rule {i}: {group or 'core'}/{resource} {verb}" for role, i, group, resource, verb in unused
    )


def no_scenario_refused(record: Record) -> None:
    _skip_unless_whole_directory(record)
    refused = [line for line in record.denied if "cannot" in line or "attempts to grant" in line]
    assert refused == [], "\n".join(refused[:20])


@after_workers(every_granted_rule_used)
def test_the_scenarios_used_every_granted_rule(rbac: RbacSession, request: pytest.FixtureRequest) -> None:
    every_granted_rule_used(_record(rbac, request.session))


@after_workers(no_scenario_refused)
def test_no_scenario_was_refused(rbac: RbacSession, request: pytest.FixtureRequest) -> None:
    no_scenario_refused(_record(rbac, request.session))
