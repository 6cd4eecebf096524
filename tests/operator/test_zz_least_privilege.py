"""Least privilege, enforced: every (API group, resource, verb) the chart's rendered Roles and
ClusterRoles grant was needed by some scenario of this directory, and no scenario was refused.

Every emulated API server of ``tests/operator`` authorizes against the chart's RBAC (the ``rbac``
session fixture, ``conftest.py``) and records which rule allowed each request. This module runs last
(its name sorts last) and reads that record; run alone, or with part of the directory deselected, it
skips (the record would be incomplete). Scenarios marked ``slow`` do not count: the default suite must
use every rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from multilane.testing.kube_rbac import granted_triples, unused_grants
from tests.operator.conftest import RbacSession

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


def _whole_directory_ran(session: pytest.Session) -> list[str]:
    """Test modules of this directory with no item in the session (empty: all collected). A module whose
    every test is ``slow`` does not count: the default suite must use every rule without it."""
    collected = {Path(str(item.path)).name for item in session.items}
    return sorted(
        p.name
        for p in HERE.glob("test_*.py")
        if p.name != Path(__file__).name and p.name not in collected and not _only_slow(p)
    )


def test_the_scenarios_used_every_granted_rule(rbac: RbacSession, request: pytest.FixtureRequest) -> None:
    missing = _whole_directory_ran(request.session)
    if missing:
        pytest.skip(f"needs every scenario of tests/operator in the session; not collected: {missing}")
    assert rbac.scenarios, "no scenario ran under the chart's RBAC"
    assert granted_triples(rbac.manifests), "the chart renders no rule"
    unused = unused_grants(rbac.manifests, rbac.usage)
    assert unused == [], "granted by the chart, needed by no scenario (remove them):\n" + "\n".join(
        f"  {role} rule {i}: {group or 'core'}/{resource} {verb}" for role, i, group, resource, verb in unused
    )


def test_no_scenario_was_refused(rbac: RbacSession, request: pytest.FixtureRequest) -> None:
    missing = _whole_directory_ran(request.session)
    if missing:
        pytest.skip(f"needs every scenario of tests/operator in the session; not collected: {missing}")
    refused = [line for line in rbac.usage.denied if "cannot" in line or "attempts to grant" in line]
    assert refused == [], "\n".join(refused[:20])
