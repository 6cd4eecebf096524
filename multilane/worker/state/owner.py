"""The owner stamp of a state directory: a worker never opens stores another ParallelConsumer left.
Does I/O (files).

On Kubernetes the state directory is a PersistentVolumeClaim named after the pod (``state-NAME-N``).
A volume can outlive its ParallelConsumer (``spec.state.pvcRetention.whenDeleted: Retain``, or a claim
left by hand), and a ParallelConsumer re-created under the same name mounts it again: its RocksDB
stores hold the old consumer's state, which the new one's changelogs do not describe. So the operator
gives each worker its ParallelConsumer's uid (``MULTILANE_STATE_OWNER``), and :func:`claim_state_dir`
runs before the state store opens:

1. Read ``OWNER`` in the directory.
2. Same owner: keep everything (a restarted or rescheduled pod starts warm).
3. Another owner, or no stamp on a directory that holds anything (written before stamps existed, or
   by an unknown writer): remove every entry. The stores are then restored from the changelogs as on
   a new volume (restore on open), never used.
4. Write the stamp (to a temporary file, then renamed: a crash leaves the old stamp or the new one).

``lost+found`` (made by ext4 at the volume root, owned by root) is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

__all__ = ["OWNER_ENV", "OWNER_FILE", "claim_state_dir"]

log = logging.getLogger(__name__)

OWNER_FILE = "OWNER"
OWNER_ENV = "MULTILANE_STATE_OWNER"
_KEEP = {OWNER_FILE, "lost+found"}


def claim_state_dir(state_dir: str | os.PathLike[str], owner: str) -> bool:
    """Make ``state_dir`` belong to ``owner`` (wiping another owner's content); True when wiped."""
    if not owner.strip():
        raise ValueError("the state directory's owner must be non-empty")
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    stamp = root / OWNER_FILE
    # 1. The stamp.
    current = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else None
    # 2. Ours: keep.
    if current == owner:
        return False
    # 3. Another owner's (or unstamped) content: wipe.
    entries = [e for e in root.iterdir() if e.name not in _KEEP]
    wiped = bool(entries)
    if wiped:
        log.warning(
            "state directory %s belongs to %s, not %s: wiping %d entries (restored from the changelogs)",
            root,
            current or "no stamped owner",
            owner,
            len(entries),
        )
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    # 4. Stamp it.
    tmp = root / f".{OWNER_FILE}.tmp"
    tmp.write_text(owner + "\n", encoding="utf-8")
    os.replace(tmp, stamp)
    return wiped
