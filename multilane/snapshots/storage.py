"""Access to a snapshot URI through pyarrow's file systems. Does I/O.

A snapshot URI is a local path (``/var/snapshots``, ``./snap``) or any URI that
``pyarrow.fs.FileSystem.from_uri`` understands (``file:///...``, ``s3://bucket/prefix``,
``gs://...``, ``hdfs://...``). Paths handed to :class:`SnapshotStore` are relative to that root and
use ``/``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

from multilane.snapshots.layout import MANIFESTS_DIR, SnapshotId, parse_manifest_name

__all__ = ["SnapshotStore", "list_visible_ids", "resolve_uri"]

_CHUNK = 1 << 20


def resolve_uri(uri: str) -> tuple[Any, str]:
    """``(pyarrow FileSystem, root path)`` for ``uri``; a plain path is made absolute first."""
    from pyarrow import fs as pafs

    if "://" not in uri:
        uri = os.path.abspath(uri)
    filesystem, root = pafs.FileSystem.from_uri(uri)
    return filesystem, root.rstrip("/")


class SnapshotStore:
    """A folder of snapshots on a pyarrow file system.

    Invariant: ``root`` has no trailing ``/``; every method takes paths relative to it.
    Picklable (it re-resolves the file system from ``uri``), so Spark tasks can carry it.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs, self.root = resolve_uri(uri)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (SnapshotStore, (self.uri,))

    def abs(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    # -- writing -------------------------------------------------------------------------------------

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole file (parents created as needed)."""
        path = self.abs(rel)
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def upload_file(self, local_path: str, rel: str) -> tuple[int, str]:
        """Copy a local file to ``rel``; return its ``(size, sha256)`` computed while copying."""
        path = self.abs(rel)
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        digest = hashlib.sha256()
        size = 0
        with open(local_path, "rb") as src, self.fs.open_output_stream(path) as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        return size, digest.hexdigest()

    def move(self, src_rel: str, dest_rel: str) -> None:
        """Rename (atomic on local and POSIX file systems; a single new object on object stores)."""
        self.fs.move(self.abs(src_rel), self.abs(dest_rel))

    def delete_file(self, rel: str) -> bool:
        """Delete a file; False when it was already gone."""
        try:
            self.fs.delete_file(self.abs(rel))
            return True
        except FileNotFoundError:
            return False

    def delete_dir(self, rel: str) -> bool:
        """Delete a folder recursively; False when it was already gone."""
        try:
            self.fs.delete_dir(self.abs(rel))
            return True
        except FileNotFoundError:
            return False

    # -- reading -------------------------------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.abs(rel)) as f:
            return bytes(f.read())

    def size(self, rel: str) -> int | None:
        """The file's size, or None when it does not exist."""
        from pyarrow import fs as pafs

        info = self.fs.get_file_info(self.abs(rel))
        if info.type != pafs.FileType.File:
            return None
        return int(info.size)

    def list_names(self, rel: str) -> Iterator[tuple[str, bool]]:
        """``(name, is_dir)`` of the entries directly under ``rel`` (nothing when it does not exist)."""
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(self.abs(rel), allow_not_found=True, recursive=False)
        for info in self.fs.get_file_info(selector):
            yield info.base_name, info.type == pafs.FileType.Directory


def list_visible_ids(store: SnapshotStore) -> list[str]:
    """Ids of the published snapshots (``manifests/<id>.json``), oldest first."""
    ids = []
    for name, is_dir in store.list_names(MANIFESTS_DIR):
        parsed = parse_manifest_name(name)
        if not is_dir and parsed is not None and not parsed[1]:
            ids.append(parsed[0])
    return sorted(ids, key=lambda i: (SnapshotId.created_at(i), i))
