"""``--dist loadgroup`` on pytest 9.2: the ``xdist_group`` mark reaches the scheduler again. A pytest
plugin (``tests/conftest.py`` loads it). No I/O.

pytest-xdist 3.8.0 passes an item's group to its controller as a suffix of the node id
(``tests/cluster/test_x.py::test@real-cluster``), written into ``item._nodeid``. pytest 9.2 keeps the
node id in a structured ``item._id`` and no longer reads ``_nodeid``, so the suffix is lost and every
grouped test is scheduled alone (pytest-dev/pytest-xdist#1386, open; fix proposed in #1388). For the
real-cluster tier that meant a control plane per worker, each on a share of the rows: a conformance
row whose object another row makes ran on a worker where that row had not (``conditional-patch``:
both servers answered 404 to its first GET, beside the parallel pass only).

Here, on a worker under ``--dist loadgroup``, each item with an ``xdist_group`` mark and no suffix gets
it in the structured id; a run where that does not take fails at collection instead of silently
spreading the group.
"""

from __future__ import annotations

import pytest

__all__ = ["group_of"]


def group_of(item: pytest.Item) -> str | None:
    """The item's group name as pytest-xdist forms it (several marks: sorted, joined by ``_``)."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue  # not grouped, or pytest-xdist's own suffix took (a pytest before 9.2)
        from _pytest.nodeid import NodeId  # pytest 9.2's structured node id

        item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
        if not item.nodeid.endswith(f"@{group}"):
            raise pytest.UsageError(
                f"{item.nodeid}: its xdist_group {group!r} cannot reach the loadgroup scheduler"
                " with this pytest and pytest-xdist (tests/support/xdist_groups.py)"
            )
