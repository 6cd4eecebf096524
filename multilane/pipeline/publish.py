"""Publishing snapshots atomically, retention and garbage collection on a snapshot URI. Does I/O.

Readers list ``manifests/`` only, so a snapshot is visible exactly when ``manifests/<id>.json``
exists, and that file is written only after every data file and the data folder's own manifest copy
are complete. See :meth:`SnapshotPublisher.publish` for the numbered protocol.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from multilane.pipeline.retention import RetentionPlanner, StagingGarbagePlanner
from multilane.snapshots.layout import (
    DATA_DIR,
    MANIFESTS_DIR,
    data_dir,
    data_manifest_path,
    manifest_path,
    manifest_tmp_path,
    parse_manifest_name,
)
from multilane.snapshots.manifest import ManifestCodec, SnapshotManifest
from multilane.snapshots.storage import SnapshotStore, list_visible_ids

__all__ = ["CleanupReport", "PublishError", "SnapshotPublisher"]

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """The data of a snapshot is not what its manifest says; nothing was published."""


@dataclass
class CleanupReport:
    """What retention and garbage collection deleted (snapshot ids and temp manifest names)."""

    retired: list[str] = field(default_factory=list)
    garbage_data: list[str] = field(default_factory=list)
    garbage_tmp: list[str] = field(default_factory=list)


class SnapshotPublisher:
    """The writing side of the snapshot URI's protocol: publish, retire, collect garbage."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store

    def verify_files(self, manifest: SnapshotManifest) -> None:
        """Check that every data file exists with the size the manifest records (PublishError if not)."""
        for p in manifest.partitions:
            for f in p.files:
                size = self.store.size(f.path)
                if size != f.size:
                    raise PublishError(
                        f"snapshot {manifest.snapshot_id}: {f.path} has size {size}, manifest says {f.size}"
                    )

    def publish(self, manifest: SnapshotManifest) -> None:
        """Make a fully written snapshot visible.

        Precondition: every data file of ``manifest`` is written under ``data/<id>/``.

        1. Verify each data file's size against the manifest.
        2. Write the manifest into the data folder (``data/<id>/_manifest.json``), the folder's last file.
        3. Write the manifest to ``manifests/<id>.json.tmp-<nonce>`` (readers ignore it).
        4. Rename it to ``manifests/<id>.json``: from here on readers see the snapshot. A crash before
           this step leaves nothing visible; garbage collection removes the leftovers later.
        """
        sid = manifest.snapshot_id
        data = ManifestCodec.encode(manifest)
        # 1.
        self.verify_files(manifest)
        # 2.
        self.store.write_bytes(data_manifest_path(sid), data)
        # 3.
        tmp = manifest_tmp_path(sid, secrets.token_hex(4))
        self.store.write_bytes(tmp, data)
        # 4.
        self.store.move(tmp, manifest_path(sid))
        log.info("published snapshot %s (%d rows)", sid, manifest.total_rows)

    def retire(self, snapshot_id: str) -> None:
        """Delete one snapshot, manifest first (1: it stops being visible; 2: its data goes)."""
        # 1.
        self.store.delete_file(manifest_path(snapshot_id))
        # 2.
        self.store.delete_dir(data_dir(snapshot_id))

    def cleanup(
        self, retain: int, now: datetime, grace: timedelta, protect: tuple[str, ...] = ()
    ) -> CleanupReport:
        """Apply retention, then collect garbage.

        1. Keep the newest ``retain`` visible snapshots (and ``protect``); retire the others.
        2. Delete data folders without a visible manifest that were created before ``now - grace``
           (killed or failed jobs; younger ones may belong to a job still writing).
        3. Delete temp manifests of the same age.
        """
        report = CleanupReport()
        # 1.
        plan = RetentionPlanner(retain).plan(list_visible_ids(self.store), protect=protect)
        for sid in plan.delete:
            self.retire(sid)
            report.retired.append(sid)
        # 2.
        gc = StagingGarbagePlanner(grace)
        visible = list_visible_ids(self.store)
        data_ids = [name for name, is_dir in self.store.list_names(DATA_DIR) if is_dir]
        for sid in gc.data_garbage(data_ids, visible, now):
            self.store.delete_dir(data_dir(sid))
            report.garbage_data.append(sid)
        # 3.
        tmps = []
        for name, is_dir in self.store.list_names(MANIFESTS_DIR):
            parsed = parse_manifest_name(name)
            if not is_dir and parsed is not None and parsed[1]:
                tmps.append((name, parsed[0]))
        for name in gc.tmp_garbage(tmps, now):
            self.store.delete_file(f"{MANIFESTS_DIR}/{name}")
            report.garbage_tmp.append(name)
        return report
