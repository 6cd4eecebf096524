"""Local checkpoints: what a cleanly closed store contains. Does I/O (one small JSON file).

A checkpoint is written only on a clean close, *after* the final commit and after the database has
been flushed and closed; it is deleted as soon as the store is opened again. So its presence means:
the database on disk holds exactly the changelog prefix ``[0, changelog_offset)`` filtered by the
committed offset ``committed_offset`` -- plus the changes listed in ``above_commit_sources``, which
were applied although their input records lie at or above ``committed_offset`` (they were done per the
progress record, or written by this worker before the final commit). A later open may reuse the store
only if the committed offset has not moved backwards and every listed source is still applicable; see
``docs/state.md`` ("Checkpoint rules"). After a kill -9 there is no checkpoint and the store is wiped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from multilane.worker.state.errors import CheckpointError

__all__ = ["CHECKPOINT_FILE", "Checkpoint", "CheckpointStore"]

CHECKPOINT_FILE = "checkpoint.json"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Invariants: ``changelog_offset >= 0``; ``committed_offset >= 0``; every source
    ``(offset, key_hash)`` has ``offset >= committed_offset`` (sources below it are committed and are
    not listed) and ``0 <= key_hash < 2**32``."""

    changelog_offset: int
    committed_offset: int
    above_commit_sources: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.changelog_offset < 0 or self.committed_offset < 0:
            raise CheckpointError(f"checkpoint offsets must be >= 0: {self}")
        for off, h in self.above_commit_sources:
            if off < self.committed_offset or not 0 <= h < (1 << 32):
                raise CheckpointError(
                    f"checkpoint source ({off}, {h}) is invalid for {self.committed_offset}"
                )

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _VERSION,
                "changelog_offset": self.changelog_offset,
                "committed_offset": self.committed_offset,
                "above_commit_sources": [list(s) for s in self.above_commit_sources],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        try:
            data = json.loads(text)
            if data.get("version") != _VERSION:
                raise CheckpointError(f"unsupported checkpoint version {data.get('version')!r}")
            sources = tuple((int(o), int(h)) for o, h in data["above_commit_sources"])
            return cls(int(data["changelog_offset"]), int(data["committed_offset"]), sources)
        except CheckpointError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"unreadable checkpoint: {exc}") from exc


class CheckpointStore:
    """Reads, writes (atomically: temp file, fsync, rename, fsync directory) and removes the checkpoint
    file of one partition directory. Does I/O."""

    def __init__(self, directory: Path) -> None:
        self.path: Path = directory / CHECKPOINT_FILE

    def read(self) -> Checkpoint | None:
        """The checkpoint, or None when there is none. :class:`CheckpointError` when unreadable."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.path}: {exc}") from exc
        return Checkpoint.from_json(text)

    def write(self, checkpoint: Checkpoint) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(checkpoint.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Delete the checkpoint (and a leftover temp file); durable before returning."""
        existed = False
        for p in (self.path, self.path.with_suffix(".tmp")):
            try:
                p.unlink()
                existed = True
            except FileNotFoundError:
                pass
        if existed:
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
