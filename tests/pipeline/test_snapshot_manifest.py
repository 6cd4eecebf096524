"""The manifest codec: round trip, validation, and clear errors for corrupt manifests."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from multilane.formats.keyranges import KeyRange, KeyRangeMap
from multilane.snapshots.manifest import (
    ManifestCodec,
    ManifestError,
    PartitionEntry,
    ShardFile,
    SnapshotManifest,
)

SID = "snap-20261122T061129123Z-0a1b2c3d"
SHA = "ab" * 32


def manifest(**overrides: object) -> SnapshotManifest:
    layout = KeyRangeMap.even(2)
    files = (
        ShardFile(f"data/{SID}/orders/0/shard-00000.parquet", layout[0], 3, 100, SHA),
        ShardFile(f"data/{SID}/orders/0/shard-00001.parquet", layout[1], 2, 90, SHA),
    )
    entry = PartitionEntry("orders", "g.orders.changelog", 0, 0, 50, 40, 12, 5, 50, files)
    empty = PartitionEntry("orders", "g.orders.changelog", 1, 0, 0, 0, None, 0, 0, ())
    fields: dict[str, object] = {
        "snapshot_id": SID,
        "created_at": datetime(2026, 11, 22, 6, 11, 29, 123000, tzinfo=UTC),
        "group": "g",
        "layout": layout,
        "partitions": (entry, empty),
        "stats": {"records_read": 50},
    }
    fields.update(overrides)
    return SnapshotManifest(**fields)  # type: ignore[arg-type]


def test_round_trip() -> None:
    m = manifest()
    data = ManifestCodec.encode(m)
    back = ManifestCodec.decode(data)
    assert back == m
    assert back.factor == 2
    p0 = back.partition("orders", 0)
    assert p0 is not None and p0.changelog_offset == 40
    assert back.partition("orders", 7) is None
    assert back.total_rows == 5
    doc = json.loads(data)
    assert doc["layout"]["factor"] == 2 and doc["partitions"][0]["changelog_end"] == 50


def test_explicit_layout_has_no_factor() -> None:
    m = manifest(layout=KeyRangeMap.from_ranges([(0, 5), (5, 2**32)]), partitions=())
    assert ManifestCodec.decode(ManifestCodec.encode(m)).factor is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.__setitem__("format", "other/v9"), "unsupported format"),
        (lambda d: d.pop("snapshot_id"), "missing field 'snapshot_id'"),
        (lambda d: d.__setitem__("created_at", "yesterday"), "created_at"),
        (lambda d: d["partitions"][0].__setitem__("rows", "5"), r"'partitions\[0\].rows' must be an integer"),
        (lambda d: d["partitions"][0].__setitem__("changelog_offset", 99), "changelog_offset"),
        (lambda d: d["partitions"][0].__setitem__("rows", 6), "sum of file rows"),
        (lambda d: d["partitions"][0]["files"][0].__setitem__("sha256", "xyz"), "sha256"),
        (lambda d: d["partitions"][0]["files"][0].__setitem__("path", "../../etc/passwd"), "relative"),
        (
            lambda d: d["partitions"][0]["files"][1].__setitem__("range", [0, 2**32]),
            "overlap|more than one range",
        ),
        (lambda d: d["layout"].__setitem__("ranges", [[0, 10]]), "end at 2\\*\\*32"),
        (lambda d: d["partitions"].append(d["partitions"][0]), "appears twice"),
    ],
)
def test_invalid_manifests_raise_a_clear_error(mutate: object, message: str) -> None:
    doc = json.loads(ManifestCodec.encode(manifest()))
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(ManifestError, match=message) as info:
        ManifestCodec.decode(json.dumps(doc).encode(), source="s3://b/manifests/x.json")
    assert "s3://b/manifests/x.json" in str(info.value)


@pytest.mark.parametrize("data", [b"", b'{"format": "multilane.snap', b"\xff\xfe", b"[1, 2]"])
def test_truncated_or_garbage_bytes_raise_manifest_error(data: bytes) -> None:
    with pytest.raises(ManifestError, match=r"corrupt or truncated|top level"):
        ManifestCodec.decode(data, source="m.json")


def test_file_and_entry_invariants() -> None:
    with pytest.raises(ValueError, match="rows >= 1"):
        ShardFile("a.parquet", KeyRange(0, 1), 0, 1, SHA)
    with pytest.raises(ValueError, match="snapshot id"):
        manifest(snapshot_id="latest")
