"""The snapshot job without Spark (``SnapshotJob.run_in_process``: the Spark tasks' code in this process)
on the embedded broker: it equals the replay oracle, and a job failing before publishing leaves nothing
visible. The Spark end-to-end test is ``test_snapshot_spark.py`` (one test in the default suite)."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from multilane.formats.keyranges import KeyRangeMap, key_hash
from multilane.pipeline.job import SnapshotJob
from multilane.snapshots.layout import DATA_DIR
from multilane.snapshots.reader import SnapshotReader
from multilane.testing.broker import EmbeddedBroker
from tests.pipeline.test_snapshot_spark import generate, job_config, oracle, produce

pytestmark = [pytest.mark.broker, pytest.mark.matrix]


def test_in_process_job_equals_replay_with_bounds_and_resharding(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    group, uri = topic_name, str(tmp_path / "snapshots")
    changelog = f"{group}.orders.changelog"
    broker.create_topic(changelog, 2)
    rng = random.Random(21)
    records = {p: generate(rng, 500 + 100 * p, keys=50) for p in (0, 1)}
    ends = {p: produce(broker, changelog, p, records[p]) for p in (0, 1)}
    bound = 350  # partition 0: stops at the first change of record 350; partition 1: everything
    config = job_config(
        broker,
        group,
        uri,
        layout=KeyRangeMap.even(3),
        source_bounds={("orders", 0): bound, ("orders", 1): 10**9},
        max_records_per_task=130,
    )
    result = SnapshotJob(config).run_in_process()
    assert result.records_read < sum(len(r) for r in records.values())  # partition 0 stopped early
    reader = SnapshotReader(uri)
    for p, committed in ((0, bound), (1, None)):
        part = reader.latest_covering("orders", p)
        assert part is not None and part.snapshot_id == result.manifest.snapshot_id
        if committed is None:
            assert part.changelog_offset == part.changelog_end == ends[p]
            expected = oracle(records[p])
        else:
            first = next(i for i, r in enumerate(records[p]) if r[1] != "T" and r[2] >= bound)
            assert part.changelog_offset == first < part.changelog_end
            expected = oracle(records[p][:first])
        assert expected and dict(part.iter_items()) == expected
        for key_range in KeyRangeMap.even(3):
            got = dict(part.iter_key_range(key_range))
            assert got == {k: v for k, v in expected.items() if key_hash(k) in key_range}
        batches = list(part.iter_item_batches(max_rows=7))
        assert all(0 < len(b) <= 7 for b in batches) and dict(i for b in batches for i in b) == expected


def test_failed_job_leaves_nothing_visible_and_a_later_run_cleans_up(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job dies after all data is written, right before the manifest (the SIGKILL variant of the
    CLI is the ``slow`` test in ``test_snapshot_spark.py``)."""
    from multilane.pipeline import job as job_module

    group, uri = topic_name, str(tmp_path / "snapshots")
    changelog = f"{group}.orders.changelog"
    broker.create_topic(changelog, 1)
    records = generate(random.Random(8), 200, keys=30)
    produce(broker, changelog, 0, records)
    config = job_config(broker, group, uri, staging_grace=timedelta(0), max_records_per_task=1000)

    def crash(self: Any, manifest: Any) -> None:
        raise RuntimeError("killed before publishing")

    # 1. The job dies between writing its data and publishing: data exists, nothing is visible.
    with monkeypatch.context() as m:
        m.setattr(job_module.SnapshotPublisher, "publish", crash)
        with pytest.raises(RuntimeError, match="killed before publishing"):
            SnapshotJob(config).run_in_process()
    assert list((tmp_path / "snapshots" / DATA_DIR).rglob("*.parquet"))
    assert SnapshotReader(uri).snapshot_ids() == []
    assert SnapshotReader(uri).latest_covering("orders", 0) is None

    # 2. A later run publishes and removes the dead job's data (grace 0).
    ok = SnapshotJob(config).run_in_process()
    assert len(ok.cleanup.garbage_data) == 1
    assert sorted(p.name for p in (tmp_path / "snapshots" / DATA_DIR).iterdir()) == [ok.manifest.snapshot_id]
    part = SnapshotReader(uri).latest_covering("orders", 0)
    assert part is not None and dict(part.iter_items()) == oracle(records)
