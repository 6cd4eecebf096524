"""The real-cluster tier's fixtures: one loopback control plane (etcd, kube-apiserver,
kube-controller-manager; :class:`multilane.testing.cluster.LocalCluster`) and one process kubelet
per test session. docs/real-cluster.md describes both.

Without the binaries (``bash scripts/k8s-binaries.sh`` builds them) every test here is skipped with
the reason; under ``CI=true`` it fails instead: CI builds them in ``scripts/bootstrap.sh all``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from multilane.testing.cluster import ClusterError, LocalCluster, resolve_bin_dir
from multilane.testing.cluster_cli import entrypoints as cluster_entrypoints
from multilane.testing.process_kubelet import ProcessKubelet

DOCS_IMAGE = "registry.example.com/platform/multilane"  # docs/operator-install.md's image.repository


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.cluster)
            # one xdist worker runs them all: one control plane, not one per worker (--dist loadgroup)
            item.add_marker(pytest.mark.xdist_group("real-cluster"))


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """The binaries' directory: skipped without them, failed under CI=true."""
    try:
        return resolve_bin_dir()
    except ClusterError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the real-cluster tier cannot run: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def real_cluster(k8s_bin_dir: Path) -> Iterator[LocalCluster]:
    """A control plane for the session; tests isolate themselves by namespace."""
    with LocalCluster(k8s_bin_dir, start_timeout_s=240) as cluster:  # a loaded 2-core machine is slow
        yield cluster


@pytest.fixture(scope="session")
def process_kubelet(real_cluster: LocalCluster) -> Iterator[ProcessKubelet]:
    """The cluster's one node: pods run as local processes (short restart back-off for tests). The
    chart's image runs as this machine's ``python -m multilane`` (the image's ENTRYPOINT): the chart's
    default repository and the one docs/operator-install.md installs (``registry.example.com``)."""
    entrypoints = cluster_entrypoints([DOCS_IMAGE])
    with ProcessKubelet(real_cluster, backoff_s=1.0, entrypoints=entrypoints) as kubelet:
        yield kubelet
