"""PySpark jobs for bulk state work: state snapshots built from changelogs. Does I/O.

- ``multilane snapshot`` (:mod:`multilane.pipeline.cli`) runs :class:`multilane.pipeline.job.SnapshotJob`.
- The format (layout, manifest, storage, reader) is :mod:`multilane.snapshots`, shared with the
  worker; learners read snapshots with :class:`multilane.snapshots.reader.SnapshotReader`
  (``latest_covering(topic, partition, *, committed_offset=None) -> SnapshotPartition | None``) and
  :func:`multilane.pipeline.restore.restore_from_snapshot_and_tail`.
- The operator renders the CronJob / Job with :mod:`multilane.pipeline.k8s` (pure).

Nothing is imported here, so that importing one part (say, the reader) does not import Spark.
See ``docs/snapshots.md``.
"""
