"""Where a snapshot's files live under the snapshot URI, and snapshot ids. Pure: no I/O.

::

    <uri>/manifests/<id>.json                       visible snapshots: readers list only this folder
    <uri>/manifests/<id>.json.tmp-<nonce>           a manifest being published (ignored by readers)
    <uri>/data/<id>/_manifest.json                  the manifest, written after all data files
    <uri>/data/<id>/<topic>/<partition>/shard-<i>.parquet   one file per (partition, key range)

A snapshot id is ``snap-<UTC time to the millisecond>-<8 hex digits>``: ids sort by creation time,
and the time in the id (not a file system timestamp, which object stores lack) dates staging garbage.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime

__all__ = [
    "DATA_DIR",
    "MANIFESTS_DIR",
    "SnapshotId",
    "data_dir",
    "data_manifest_path",
    "manifest_path",
    "manifest_tmp_path",
    "parse_manifest_name",
    "shard_path",
]

MANIFESTS_DIR = "manifests"
DATA_DIR = "data"
_ID_RE = re.compile(r"^snap-(\d{8}T\d{9})Z-([0-9a-f]{8})$")
_TMP_RE = re.compile(r"^(snap-\d{8}T\d{9}Z-[0-9a-f]{8})\.json\.tmp-[0-9a-f]+$")


class SnapshotId:
    """Snapshot ids: creation and parsing. Invariant: ``parse(new(t)) == t`` to the millisecond."""

    @staticmethod
    def new(created: datetime, nonce: str | None = None) -> str:
        if created.tzinfo is None:
            raise ValueError("snapshot creation time must be timezone-aware")
        t = created.astimezone(UTC)
        stamp = t.strftime("%Y%m%dT%H%M%S") + f"{t.microsecond // 1000:03d}"
        nonce = nonce if nonce is not None else secrets.token_hex(4)
        if not re.fullmatch(r"[0-9a-f]{8}", nonce):
            raise ValueError(f"nonce must be 8 hex digits, got {nonce!r}")
        return f"snap-{stamp}Z-{nonce}"

    @staticmethod
    def is_valid(snapshot_id: str) -> bool:
        return _ID_RE.match(snapshot_id) is not None

    @staticmethod
    def created_at(snapshot_id: str) -> datetime:
        """The creation time encoded in ``snapshot_id`` (ValueError for a malformed id)."""
        m = _ID_RE.match(snapshot_id)
        if m is None:
            raise ValueError(f"not a snapshot id: {snapshot_id!r}")
        stamp = m.group(1)
        t = datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
        return t.replace(microsecond=int(stamp[15:]) * 1000)


def manifest_path(snapshot_id: str) -> str:
    return f"{MANIFESTS_DIR}/{snapshot_id}.json"


def manifest_tmp_path(snapshot_id: str, nonce: str) -> str:
    return f"{MANIFESTS_DIR}/{snapshot_id}.json.tmp-{nonce}"


def parse_manifest_name(name: str) -> tuple[str, bool] | None:
    """``(snapshot id, is_tmp)`` for a file name in ``manifests/``; None for anything else."""
    if name.endswith(".json") and SnapshotId.is_valid(name[: -len(".json")]):
        return name[: -len(".json")], False
    m = _TMP_RE.match(name)
    if m is not None:
        return m.group(1), True
    return None


def data_dir(snapshot_id: str) -> str:
    return f"{DATA_DIR}/{snapshot_id}"


def data_manifest_path(snapshot_id: str) -> str:
    return f"{DATA_DIR}/{snapshot_id}/_manifest.json"


def shard_path(snapshot_id: str, topic: str, partition: int, shard: int) -> str:
    if "/" in topic or topic in ("", ".", ".."):
        raise ValueError(f"topic name {topic!r} cannot be a path component")
    return f"{DATA_DIR}/{snapshot_id}/{topic}/{partition}/shard-{shard:05d}.parquet"
