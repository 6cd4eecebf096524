"""PySpark jobs for bulk state work: state snapshots built from changelogs. Does I/O.

- ``multilane snapshot`` (:mod:`multilane.pipeline.cli`) runs :class:`multilane.pipeline.job.SnapshotJob`.
- Learners read snapshots with :class:`multilane.pipeline.reader.SnapshotReader`
  (``latest_covering(topic, partition, *, committed_offset=None) -> SnapshotPartition | None``) and
  :func:`multilane.pipeline.restore.restore_from_snapshot_and_tail`.
- The operator renders the CronJob / Job with :mod:`multilane.pipeline.k8s` (pure).

Nothing is imported here, so that importing one part (say, the reader) does not import Spark.
See ``docs/snapshots.md``.
"""
