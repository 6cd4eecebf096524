"""``Handover``: what a partition's last owner handed over when it released it, for the next owner,
and its one codec on the wire (the ``progress`` list of ``POST /v1/assignment``). Pure: no I/O
(``base64`` only).

The operator carries a release's :class:`Handover` from the worker that released the partition to the
one that takes it; the next owner uses it instead of reading the progress topic inside the pause
(docs/architecture.md, "Worker control API"). A new hint is one more field here and in
:func:`encode_handovers` / :func:`decode_handovers`; the six implementations of ``WorkerControl.assign``
pass the value on unchanged.

Wire form of one partition's handover (``progress`` list item)::

    {"topic": str, "partition": int >= 0, "progress": base64 str, "changelog_end": int >= 0 (optional)}

``progress`` is required: the changelog end counts only together with the progress record of the same
release (the worker trusts it only when that record is for the committed offset it reads).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Handover", "HandoverError", "decode_handovers", "encode_handovers"]


class HandoverError(ValueError):
    """A handover on the wire that does not decode; the message is one line naming the item."""


@dataclass(frozen=True, slots=True)
class Handover:
    """One partition's handover. ``progress``: the progress record of the release's final commit,
    base64 as on the wire (opaque to the operator; :meth:`record` decodes it). ``changelog_end``:
    where the partition's changelog ended at that release (None: not known)."""

    progress: str
    changelog_end: int | None = None

    def record(self) -> bytes:
        """The progress record's bytes; HandoverError when ``progress`` is not base64."""
        try:
            return base64.b64decode(self.progress.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise HandoverError(f"progress is not base64: {exc}") from None


def encode_handovers(handovers: Mapping[tuple[str, int], Handover]) -> list[dict[str, Any]]:
    """The wire list of ``handovers`` ((topic, partition) -> handover), sorted by partition."""
    out: list[dict[str, Any]] = []
    for (topic, partition), handover in sorted(handovers.items()):
        item: dict[str, Any] = {"topic": topic, "partition": partition, "progress": handover.progress}
        if handover.changelog_end is not None:
            item["changelog_end"] = handover.changelog_end
        out.append(item)
    return out


def decode_handovers(raw: Any) -> dict[tuple[str, int], Handover]:
    """The handovers of a wire list (the inverse of :func:`encode_handovers`); every field checked,
    the first bad one raises :class:`HandoverError` (one line)."""
    if not isinstance(raw, list):
        raise HandoverError("'progress' must be a list of {topic, partition, progress} objects")
    out: dict[tuple[str, int], Handover] = {}
    for item in raw:
        if not isinstance(item, dict):
            raise HandoverError(f"each of 'progress' must be an object, got {item!r}")
        topic, partition = item.get("topic"), item.get("partition")
        if not isinstance(topic, str) or not topic or not isinstance(partition, int) or not _count(partition):
            raise HandoverError(f"bad partition {item!r}: needs topic (str) and partition (int >= 0)")
        text, end = item.get("progress"), item.get("changelog_end")
        if not isinstance(text, str):
            raise HandoverError(f"bad progress hint {item!r}: 'progress' must be a base64 string")
        if end is not None and not _count(end):
            raise HandoverError(
                f"bad progress hint for {topic}/{partition}: 'changelog_end' must be an int >= 0"
            )
        handover = Handover(text, end)
        try:
            handover.record()
        except HandoverError as exc:
            raise HandoverError(f"bad progress hint for {topic}/{partition}: {exc}") from None
        out[(topic, partition)] = handover
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
