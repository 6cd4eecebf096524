"""The snapshot manifest and its JSON codec. Pure: no I/O.

A manifest names one snapshot: its id and creation time, the key-range layout its files are sharded
by, and per changelog partition the offsets it covers and its files (path relative to the snapshot
URI, key range, row count, size, SHA-256). Example (abridged)::

    {"format": "multilane.snapshot/v1", "snapshot_id": "snap-20261122T061129123Z-1a2b3c4d",
     "created_at": "2026-11-22T06:11:29.123Z", "group": "orders-app",
     "layout": {"factor": 4, "ranges": [[0, 1073741824], ...]},
     "partitions": [{"topic": "orders", "changelog_topic": "orders-app.orders.changelog",
                     "partition": 0, "changelog_start": 0, "changelog_end": 5000000,
                     "changelog_offset": 5000000, "source_bound": null, "rows": 100000,
                     "records_read": 5000000,
                     "files": [{"path": "data/snap-.../orders/0/shard-00000.parquet",
                                "range": [0, 1073741824], "rows": 25012, "bytes": 2811234,
                                "sha256": "..."}]}],
     "stats": {"records_read": 5000000, "duration_s": 12.3}}

``changelog_offset`` is where restore resumes tailing the changelog; ``changelog_end`` the true end
offset when the job started (``changelog_offset <= changelog_end``; smaller only when uncommitted
changes were found, see :mod:`multilane.pipeline.merge`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from multilane.formats.keyranges import KeyRange, KeyRangeMap
from multilane.snapshots.layout import SnapshotId

__all__ = ["FORMAT", "ManifestCodec", "ManifestError", "PartitionEntry", "ShardFile", "SnapshotManifest"]

FORMAT = "multilane.snapshot/v1"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ValueError):
    """A manifest that cannot be decoded or breaks an invariant; the message names the source and field."""


@dataclass(frozen=True, slots=True)
class ShardFile:
    """One Parquet file: the live keys of one partition whose key hash lies in ``key_range``.

    Invariants: ``rows >= 1`` (empty shards have no file); ``size >= 0``; ``sha256`` is 64 lowercase
    hex digits; ``path`` is relative to the snapshot URI and never absolute or upward.
    """

    path: str
    key_range: KeyRange
    rows: int
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"shard file {self.path} must have rows >= 1, got {self.rows}")
        if self.size < 0:
            raise ValueError(f"shard file {self.path} has negative size {self.size}")
        if not _SHA256_RE.match(self.sha256):
            raise ValueError(f"shard file {self.path} has a malformed sha256 {self.sha256!r}")
        if self.path.startswith("/") or ".." in self.path.split("/") or not self.path:
            raise ValueError(f"shard file path {self.path!r} must be relative and stay under the URI")


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    """What a snapshot holds for one changelog partition.

    Invariants: ``0 <= changelog_start <= changelog_offset <= changelog_end``; ``rows`` equals the sum
    of the files' rows; files are sorted by key range and their ranges are disjoint.
    """

    topic: str
    changelog_topic: str
    partition: int
    changelog_start: int
    changelog_end: int
    changelog_offset: int
    source_bound: int | None
    rows: int
    records_read: int
    files: tuple[ShardFile, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.changelog_start <= self.changelog_offset <= self.changelog_end:
            raise ValueError(
                f"{self.changelog_topic}[{self.partition}]: needs 0 <= changelog_start <= changelog_offset "
                f"<= changelog_end, got {self.changelog_start}, {self.changelog_offset}, {self.changelog_end}"
            )
        if self.rows != sum(f.rows for f in self.files):
            raise ValueError(
                f"{self.changelog_topic}[{self.partition}]: rows {self.rows} != sum of file rows"
            )
        for a, b in zip(self.files, self.files[1:], strict=False):
            if a.key_range.end > b.key_range.start:
                raise ValueError(
                    f"{self.changelog_topic}[{self.partition}]: file ranges overlap or are unsorted"
                )


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """A published (or about to be published) snapshot.

    Invariants: ``snapshot_id`` is a valid id; ``created_at`` is timezone-aware; ``(topic, partition)``
    pairs are unique; every file's range lies inside one range of ``layout``.
    """

    snapshot_id: str
    created_at: datetime
    group: str
    layout: KeyRangeMap
    partitions: tuple[PartitionEntry, ...]
    stats: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not SnapshotId.is_valid(self.snapshot_id):
            raise ValueError(f"invalid snapshot id {self.snapshot_id!r}")
        if self.created_at.tzinfo is None:
            raise ValueError("created_at must be timezone-aware")
        seen: set[tuple[str, int]] = set()
        for p in self.partitions:
            if (p.topic, p.partition) in seen:
                raise ValueError(f"partition {p.topic}[{p.partition}] appears twice")
            seen.add((p.topic, p.partition))
            for f in p.files:
                lane = self.layout.lane_of(f.key_range.start)
                if f.key_range.end > self.layout[lane].end:
                    raise ValueError(f"file {f.path} spans more than one range of the layout")

    @property
    def factor(self) -> int | None:
        f = len(self.layout)
        return f if KeyRangeMap.even(f) == self.layout else None

    def partition(self, topic: str, partition: int) -> PartitionEntry | None:
        for p in self.partitions:
            if p.topic == topic and p.partition == partition:
                return p
        return None

    @property
    def total_rows(self) -> int:
        return sum(p.rows for p in self.partitions)


def _iso(t: datetime) -> str:
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class ManifestCodec:
    """Encodes manifests to JSON bytes and decodes them back with full validation."""

    @staticmethod
    def encode(m: SnapshotManifest) -> bytes:
        doc = {
            "format": FORMAT,
            "snapshot_id": m.snapshot_id,
            "created_at": _iso(m.created_at),
            "group": m.group,
            "layout": {"factor": m.factor, "ranges": m.layout.to_list()},
            "partitions": [
                {
                    "topic": p.topic,
                    "changelog_topic": p.changelog_topic,
                    "partition": p.partition,
                    "changelog_start": p.changelog_start,
                    "changelog_end": p.changelog_end,
                    "changelog_offset": p.changelog_offset,
                    "source_bound": p.source_bound,
                    "rows": p.rows,
                    "records_read": p.records_read,
                    "files": [
                        {
                            "path": f.path,
                            "range": [f.key_range.start, f.key_range.end],
                            "rows": f.rows,
                            "bytes": f.size,
                            "sha256": f.sha256,
                        }
                        for f in p.files
                    ],
                }
                for p in m.partitions
            ],
            "stats": dict(m.stats),
        }
        return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode()

    @staticmethod
    def decode(data: bytes, source: str = "manifest") -> SnapshotManifest:
        """Decode and validate; any problem raises :class:`ManifestError` naming ``source``."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(
                f"{source}: not valid JSON ({exc}); the file is corrupt or truncated"
            ) from exc
        try:
            return _decode_doc(doc)
        except ManifestError as exc:
            raise ManifestError(f"{source}: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ManifestError(f"{source}: invalid manifest: {what}") from exc


def _int(v: Any, name: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ManifestError(f"field {name!r} must be an integer, got {v!r}")
    return v


def _str(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise ManifestError(f"field {name!r} must be a string, got {v!r}")
    return v


def _list(v: Any, name: str) -> Sequence[Any]:
    if not isinstance(v, list):
        raise ManifestError(f"field {name!r} must be a list, got {type(v).__name__}")
    return v


def _decode_doc(doc: Any) -> SnapshotManifest:
    if not isinstance(doc, dict):
        raise ManifestError("top level must be a JSON object")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise ManifestError(f"unsupported format {fmt!r} (this reader understands {FORMAT!r})")
    created_text = _str(doc["created_at"], "created_at")
    try:
        created = datetime.fromisoformat(created_text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ManifestError(f"field 'created_at' is not an ISO-8601 time: {created_text!r}") from exc
    layout_doc = doc["layout"]
    if not isinstance(layout_doc, dict):
        raise ManifestError("field 'layout' must be an object")
    layout = KeyRangeMap.from_list(_list(layout_doc["ranges"], "layout.ranges"))
    partitions = []
    for i, p in enumerate(_list(doc["partitions"], "partitions")):
        if not isinstance(p, dict):
            raise ManifestError(f"partitions[{i}] must be an object")
        files = []
        for j, f in enumerate(_list(p["files"], f"partitions[{i}].files")):
            where = f"partitions[{i}].files[{j}]"
            if not isinstance(f, dict):
                raise ManifestError(f"{where} must be an object")
            r = _list(f["range"], f"{where}.range")
            if len(r) != 2:
                raise ManifestError(f"{where}.range must be [start, end]")
            files.append(
                ShardFile(
                    path=_str(f["path"], f"{where}.path"),
                    key_range=KeyRange(_int(r[0], f"{where}.range"), _int(r[1], f"{where}.range")),
                    rows=_int(f["rows"], f"{where}.rows"),
                    size=_int(f["bytes"], f"{where}.bytes"),
                    sha256=_str(f["sha256"], f"{where}.sha256"),
                )
            )
        bound = p["source_bound"]
        partitions.append(
            PartitionEntry(
                topic=_str(p["topic"], f"partitions[{i}].topic"),
                changelog_topic=_str(p["changelog_topic"], f"partitions[{i}].changelog_topic"),
                partition=_int(p["partition"], f"partitions[{i}].partition"),
                changelog_start=_int(p["changelog_start"], f"partitions[{i}].changelog_start"),
                changelog_end=_int(p["changelog_end"], f"partitions[{i}].changelog_end"),
                changelog_offset=_int(p["changelog_offset"], f"partitions[{i}].changelog_offset"),
                source_bound=None if bound is None else _int(bound, f"partitions[{i}].source_bound"),
                rows=_int(p["rows"], f"partitions[{i}].rows"),
                records_read=_int(p.get("records_read", 0), f"partitions[{i}].records_read"),
                files=tuple(files),
            )
        )
    stats = doc.get("stats", {})
    if not isinstance(stats, dict):
        raise ManifestError("field 'stats' must be an object")
    return SnapshotManifest(
        snapshot_id=_str(doc["snapshot_id"], "snapshot_id"),
        created_at=created,
        group=_str(doc["group"], "group"),
        layout=layout,
        partitions=tuple(partitions),
        stats=stats,
    )
