"""multilane: scale a Kafka consumer application past its topic's partition count.

Subpackages:

- ``multilane.worker``: the in-process engine (lanes, offset tracking, progress, state). Does I/O
  (Kafka, RocksDB, HTTP) in its runtime modules; its decision modules are pure.
- ``multilane.operator``: the kopf control plane and its pure policy and planning code.
- ``multilane.pipeline``: PySpark jobs for bulk state work (snapshots).
- ``multilane.sim``: a discrete-event simulator for autoscaling policies (pure, no I/O).
- ``multilane.testing``: the embedded broker and delivery-guarantee checkers.

The public processor API is re-exported from :mod:`multilane.api`.
"""

__version__ = "0.1.0"
