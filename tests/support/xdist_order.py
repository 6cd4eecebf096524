"""Under pytest-xdist, the longest test modules start first: a pytest plugin (``tests/conftest.py`` loads
it). No I/O.

xdist hands out tests in collection order, so a long module collected late (``tests/unit/test_lint.py``
runs mypy) starts when the others are nearly done and the run waits for it alone. The modules below are
the longest ones that are collected late, from the ``--durations`` that ``scripts/test.sh`` prints (each
took 2-5 minutes in a parallel run on a loaded 2-core machine). On a worker they move to the front, in
this order, each keeping its own order; every worker sorts the same way (xdist requires it). Run
serially, nothing moves (``tests/operator/test_zz_least_privilege.py`` must stay last there).
"""

from __future__ import annotations

import pytest

__all__ = ["STARTS_FIRST"]

STARTS_FIRST = (
    "tests/unit/test_lint.py",
    "tests/pipeline/test_sim_sweep.py",
    "tests/operator/test_snapshot_cronjob.py",
    "tests/pipeline/test_snapshot_spark.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return STARTS_FIRST.index(path) if path in STARTS_FIRST else len(STARTS_FIRST)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):
        items.sort(key=_rank)  # stable: the rest keep their order
