"""The state snapshot format, shared by its writer (the PySpark job, :mod:`multilane.pipeline`) and its
readers (learners and full restores, :mod:`multilane.worker.state.snapshot`): the file layout and ids
(``layout``, pure), the manifest and its codec (``manifest``, pure), the storage behind a URI
(``storage``: local files or fsspec) and the reader (``reader``: the newest snapshot covering a
partition, verified, in Parquet). Does I/O (``storage``, ``reader``); imports no Spark.
See ``docs/snapshots.md``.
"""
