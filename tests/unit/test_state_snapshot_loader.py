"""The state package stays light (no pyspark, no pyarrow on import); a snapshot URI without pyarrow
fails at construction with a clear message; the restore status counts snapshot rows in the lag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from multilane.worker.state.restore import RestoreStatus

MISSING_SNAPSHOTS = r"needs the 'snapshots' extra .*pip install 'multilane\[snapshots\]'"

if TYPE_CHECKING:
    from multilane.worker.state.store import PartitionStore

Published = tuple[str, dict[bytes, bytes], str]  # uri, items, path of the second data file


def test_importing_the_state_package_imports_neither_spark_nor_pyarrow() -> None:
    code = (
        "import sys\n"
        "import multilane.worker.state\n"
        "from multilane.worker.state import StateManager\n"
        "import multilane.worker.state.snapshot, multilane.worker.state.learner\n"
        "print(sorted(m for m in ('pyspark', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_snapshot_uri_without_pyarrow_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from multilane.worker.state import StateManager
    from multilane.worker.state.snapshot import SnapshotLoader, SnapshotSupportError

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    with pytest.raises(SnapshotSupportError, match=MISSING_SNAPSHOTS):
        SnapshotLoader(str(tmp_path), lambda t: f"g.{t}.changelog")
    with pytest.raises(SnapshotSupportError, match="pyarrow"):
        StateManager(tmp_path / "s", "127.0.0.1:1", "g", snapshot_uri=str(tmp_path / "snap"))
    # Without a snapshot URI pyarrow is not needed.
    StateManager(tmp_path / "s", "127.0.0.1:1", "g").close()


def test_restore_lag_counts_snapshot_rows_not_loaded_yet() -> None:
    st = RestoreStatus("t", 0)
    assert st.restore_lag is None
    st.unread, st.buffered, st.snapshot_rows, st.snapshot_rows_loaded = 100, 5, 1000, 400
    assert st.restore_lag == 100 + 5 + 600
    d = st.as_dict()
    assert d["snapshot_rows"] == 1000 and d["snapshot_rows_loaded"] == 400 and d["restore_lag"] == 705


# -- SnapshotLoader on a local snapshot URI (pyarrow + RocksDB, no broker) --------------------------------


def _loaded_outcome(outcome: str) -> float:
    from prometheus_client import CollectorRegistry

    from multilane.worker.state import metrics

    registry = CollectorRegistry()
    for c in metrics.COLLECTORS:
        registry.register(c)
    labels = {"topic": "orders", "partition": "0", "outcome": outcome}
    return registry.get_sample_value("multilane_state_snapshot_restores_total", labels) or 0.0


@pytest.fixture
def published(tmp_path: Path) -> Published:
    """A published snapshot of orders[0] of group ``g`` (2 files, bound 50, changelog offset 100)."""
    pytest.importorskip("pyarrow")
    from datetime import UTC, datetime

    from multilane.pipeline.publish import SnapshotPublisher
    from multilane.snapshots.storage import SnapshotStore
    from tests.pipeline.test_snapshot_store import write_snapshot

    uri = str(tmp_path / "snap")
    store = SnapshotStore(uri)
    items = {b"k%d" % i: b"v%d" % i for i in range(300)}
    m = write_snapshot(store, datetime(2026, 11, 22, 7, tzinfo=UTC), items, offset=100, bound=50)
    assert len(m.partitions[0].files) == 2
    SnapshotPublisher(store).publish(m)
    return uri, items, m.partitions[0].files[-1].path


def _store(tmp_path: Path) -> PartitionStore:
    from multilane.worker.state.store import PartitionStore

    return PartitionStore(tmp_path / "db").open()


def test_loader_loads_a_usable_snapshot(tmp_path: Path, published: Published) -> None:
    from multilane.worker.state.snapshot import SnapshotLoader

    uri, items, _ = published
    store = _store(tmp_path)
    status = RestoreStatus("orders", 0)
    before = _loaded_outcome("loaded")
    loader = SnapshotLoader(uri, lambda t: f"g.{t}.changelog", batch_rows=64)
    load = loader.load("orders", 0, 50, store, status)
    assert load is not None and load.changelog_offset == 100 and load.rows == 300
    assert dict(store.items()) == items
    assert status.snapshot_rows == status.snapshot_rows_loaded == 300
    assert status.snapshot_id == load.snapshot_id
    assert _loaded_outcome("loaded") == before + 1


@pytest.mark.parametrize(
    ("committed", "group"),
    [(49, "g"), (50, "other")],  # bounded above the committed offset; another group's changelog
)
def test_loader_passes_over_unusable_snapshots(
    tmp_path: Path, published: Published, committed: int, group: str
) -> None:
    from multilane.worker.state.snapshot import SnapshotLoader

    uri, _, _ = published
    store = _store(tmp_path)
    before = _loaded_outcome("none")
    loader = SnapshotLoader(uri, lambda t: f"{group}.{t}.changelog")
    assert loader.load("orders", 0, committed, store, RestoreStatus("orders", 0)) is None
    assert dict(store.items()) == {} and _loaded_outcome("none") == before + 1


def test_loader_never_leaves_a_partial_store(tmp_path: Path, published: Published) -> None:
    """The second file is corrupt: the first file's rows were written, and must be gone again."""
    import threading

    from multilane.worker.state.snapshot import SnapshotLoader, SnapshotStoppedError

    uri, _, second = published
    store = _store(tmp_path)
    loader = SnapshotLoader(uri, lambda t: f"g.{t}.changelog", batch_rows=10)
    # 1. Stopped (learner stopped) during the load: an error, and an empty store.
    stop = threading.Event()
    stop.set()
    with pytest.raises(SnapshotStoppedError):
        loader.load("orders", 0, 60, store, RestoreStatus("orders", 0), stop=stop)
    assert dict(store.items()) == {}
    # 2. A corrupt data file: warning + failed outcome, empty store, None (the caller replays).
    path = Path(uri) / second
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x01
    path.write_bytes(bytes(data))
    before = _loaded_outcome("failed")
    status = RestoreStatus("orders", 0)
    assert loader.load("orders", 0, 60, store, status) is None
    assert dict(store.items()) == {} and status.snapshot_id is None and status.snapshot_rows_loaded == 0
    assert _loaded_outcome("failed") == before + 1
