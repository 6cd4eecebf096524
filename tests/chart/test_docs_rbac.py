"""docs/security.md's RBAC claims against the rendered chart: the rule table row by row (both ways),
the "Never granted" list and the "`delete` only on" sentence; operator-install.md's summary of them.

The table is the contract: one row per rule, ``object | API group | resources | verbs | code``, with
``RELEASE`` for the release name and ``NAME`` for a ParallelConsumer's. A rule added to the chart and
not to the table, a verb dropped from either, or a sentence that claims what the table contradicts,
fails here."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import NAMESPACE, RELEASE, REPO, Manifest
from .test_chart import VALUE_SETS

SECURITY = REPO / "docs" / "security.md"
INSTALL = REPO / "docs" / "operator-install.md"
SECTION = "## RBAC rules and the code that needs them"
FULLNAME = f"{RELEASE}-multilane"
WORKER_ROLE = "Role `NAME-worker`"
#: A rule as compared: (kind name, API group, resources, resource names, verbs).
Rule = tuple[str, str, frozenset[str], frozenset[str], frozenset[str]]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _names(cell: str, release: str) -> frozenset[str]:
    """``leases` named `X` .. `Y``: the resource names (a range ``NAME-0 .. NAME-<n>`` kept as written)."""
    if " named " not in cell:
        return frozenset()
    return frozenset(n.replace("RELEASE", release) for n in _ticked(cell.split(" named ", 1)[1]))


def documented_rules(release: str = RELEASE) -> list[tuple[Rule, str]]:
    """The table's rows as rules, each with its raw object cell."""
    rows = []
    for line in _section(SECURITY.read_text(encoding="utf-8"), SECTION).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith(("ClusterRole ", "Role ")):
            continue
        obj, group, resources, verbs, _code = cells
        kind, name = obj.split(" ", 1)[0], _ticked(obj)[0].replace("RELEASE", release)
        api_group = "" if group == "core" else _ticked(group)[0]
        plain = resources.split(" named ", 1)[0]
        rule = (
            f"{kind}/{name}",
            api_group,
            frozenset(_ticked(plain)),
            _names(resources, release),
            frozenset(v.strip() for v in verbs.split(",")),
        )
        rows.append((rule, obj))
    return rows


def rendered_rules(docs: list[Manifest]) -> list[Rule]:
    """Every rule of the rendered Roles and ClusterRoles, one per API group."""
    out = []
    for doc in docs:
        if doc.get("kind") not in ("Role", "ClusterRole"):
            continue
        for rule in doc.get("rules", []):
            for group in rule["apiGroups"]:
                out.append(
                    (
                        f"{doc['kind']}/{doc['metadata']['name']}",
                        group,
                        frozenset(rule["resources"]),
                        frozenset(rule.get("resourceNames") or ()),
                        frozenset(rule["verbs"]),
                    )
                )
    return out


@pytest.fixture(scope="module")
def default_docs(render: Any) -> list[Manifest]:
    docs: list[Manifest] = render()
    return docs


def test_the_table_is_parsed() -> None:
    rows = documented_rules()
    assert len(rows) >= 15, rows
    assert any(obj.startswith(WORKER_ROLE) for _, obj in rows)


def test_every_chart_rule_is_a_row_and_every_row_a_chart_rule(default_docs: list[Manifest]) -> None:
    documented = sorted(r for r, obj in documented_rules() if not obj.startswith(WORKER_ROLE))
    rendered = sorted(rendered_rules(default_docs))
    missing = [r for r in rendered if r not in documented]
    stale = [r for r in documented if r not in rendered]
    assert not missing and not stale, (
        f"in the chart, not in docs/security.md: {missing}\nin the doc, not in the chart: {stale}"
    )
    # the Secrets Role is in the release namespace by default, as the text says
    secrets = [
        d for d in default_docs if d.get("kind") == "Role" and d["metadata"]["name"] == f"{FULLNAME}-secrets"
    ]
    assert [d["metadata"]["namespace"] for d in secrets] == [NAMESPACE]


def test_the_worker_role_row_is_what_the_operator_builds() -> None:
    from multilane.operator.spec import small_children
    from multilane.operator.spec.child_meta import ConsumerRef

    ref = ConsumerRef(name="orders", namespace="apps", uid="u-1")
    built = small_children.role(ref, max_replicas=3)
    [(rule, _)] = [(r, obj) for r, obj in documented_rules() if obj.startswith(WORKER_ROLE)]
    [actual] = rendered_rules([built])
    assert actual[0] == "Role/orders-worker" and rule[0] == "Role/NAME-worker"
    assert actual[1:3] == rule[1:3] and actual[4] == rule[4]
    assert rule[3] == {"NAME-0", "NAME-<maxReplicas-1>"}
    assert actual[3] == {"orders-0", "orders-1", "orders-2"}


def _sentence(text: str, start: str) -> str:
    at = text.index(start)
    end = text.find("\n\n", at)
    return " ".join(text[at:end].split())


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_never_granted_holds(render: Any, value_set: str) -> None:
    claim = _sentence(SECURITY.read_text(encoding="utf-8"), "**Never granted**")
    verbs = {"bind", "escalate", "impersonate", "deletecollection"}
    assert all(f"`{v}`" in claim for v in verbs), claim
    rules = rendered_rules(render(VALUE_SETS[value_set]))
    for _obj, _group, resources, _rn, granted in rules:
        assert "*" not in resources and "*" not in granted
        assert not granted & verbs, (resources, granted)
        if "secrets" in resources:
            assert not granted & {"list", "watch"}
        if resources & {"customresourcedefinitions", "clusterroles", "clusterrolebindings"}:
            assert not granted & {"create", "update", "patch", "delete"}, resources
    for needle in ("`secrets`", "`customresourcedefinitions`", "`clusterroles`", "`clusterrolebindings`"):
        assert needle in claim


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_delete_only_where_the_doc_says(render: Any, value_set: str) -> None:
    claim = _sentence(SECURITY.read_text(encoding="utf-8"), "**`delete` only on**")
    named = set(_ticked(claim.split(":", 1)[0])) - {"delete"}
    rules = rendered_rules(render(VALUE_SETS[value_set]))
    deletable = {res for _o, _g, resources, _n, verbs in rules if "delete" in verbs for res in resources}
    if VALUE_SETS[value_set].get("rbac", {}).get("create", True):
        assert deletable == named == {"statefulsets", "pods"}
    else:
        assert deletable == set() and named == {"statefulsets", "pods"}
    # no doc of the operator says "no delete" or "no pod deletion" again
    for path in (SECURITY, INSTALL):
        text = " ".join(path.read_text(encoding="utf-8").split())
        assert "no pod deletion" not in text, path
        assert "no `delete` on anything" not in text, path


def test_operator_install_summary_matches(default_docs: list[Manifest]) -> None:
    """operator-install.md's "What it does not get" names only verbs the chart does not grant."""
    text = " ".join(INSTALL.read_text(encoding="utf-8").split())
    summary = _sentence(INSTALL.read_text(encoding="utf-8"), "What it does **not** get")
    rules = rendered_rules(default_docs)
    secret_verbs = {v for _o, _g, res, _n, verbs in rules if "secrets" in res for v in verbs}
    assert secret_verbs == {"get", "create", "patch"}
    assert "no update/patch" not in text and "never patched" not in text
    assert "`patch`" in summary and "`delete`" in summary, summary
