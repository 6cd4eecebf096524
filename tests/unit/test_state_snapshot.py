"""The state package stays light (no pyspark, no pyarrow on import); a snapshot URI without pyarrow
fails at construction with a clear message; the restore status counts snapshot rows in the lag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from multilane.worker.state.restore import RestoreStatus


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
    with pytest.raises(SnapshotSupportError, match=r"install multilane\[pipeline\] or pyarrow"):
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
