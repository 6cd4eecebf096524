"""The output topics an app declares (``--output-topic NAME[:PARTITIONS]``), checked before the worker
consumes. Does I/O (an admin client's metadata and create requests).

Apache Kafka and the embedded broker both create a topic by default when a producer first writes to
it, or when a metadata request names it, with the broker's default partition count
(``tests/integration/test_output_topics.py`` shows it on the embedded broker). A forgotten output
topic would then appear silently, with partitions nobody chose. So the check asks for the metadata of
all topics (a request that names none creates none) and (steps of :func:`check_output_topics`):

1. finds which declared topics are missing;
2. creates those declared with a partition count (``NAME:PARTITIONS``; replication: the broker's
   default), and waits until their metadata shows every partition (another worker creating the same
   topic at the same moment is fine);
3. returns those declared without one: the worker refuses to start, with one line (exit 2).

A topic that exists is used as it is, whatever its partition count.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

from multilane.worker.config import ConfigError

__all__ = ["OutputTopic", "check_output_topics", "missing_message", "parse_output_topics"]

log = logging.getLogger("multilane.worker")

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's legal topic names


@dataclasses.dataclass(frozen=True)
class OutputTopic:
    """One declared output topic; ``partitions`` None: it must exist, else: create it if missing."""

    name: str
    partitions: int | None = None


def parse_output_topics(specs: Iterable[str]) -> tuple[OutputTopic, ...]:
    """``--output-topic`` values as :class:`OutputTopic` (a name twice: the last wins); ConfigError (one
    line) on a bad one."""
    out: dict[str, OutputTopic] = {}
    for spec in specs:
        name, sep, count = spec.strip().partition(":")
        partitions: int | None = None
        if sep:
            try:
                partitions = int(count)
            except ValueError:
                partitions = 0
            if partitions < 1:
                raise ConfigError(f"--output-topic {spec!r}: PARTITIONS must be a whole number >= 1")
        if not _NAME.match(name):
            raise ConfigError(f"--output-topic {spec!r} must look like NAME or NAME:PARTITIONS (a topic "
                              "name has letters, digits, '.', '_' and '-')")
        out[name] = OutputTopic(name, partitions)
    return tuple(out.values())


def _present(admin: Any, timeout_s: float) -> dict[str, int]:
    """Every topic the broker lists without an error, with its partition count (creates nothing)."""
    md = admin.list_topics(timeout=timeout_s)
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None and t.partitions}


def check_output_topics(admin: Any, topics: Sequence[OutputTopic], timeout_s: float = 10.0) -> list[str]:
    """Create the missing output topics that carry a partition count; return the other missing ones
    (steps 1-3 of the module docstring). Blocking: call it on a worker thread."""
    if not topics:
        return []
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    # 1. which are missing
    present = _present(admin, timeout_s)
    for t in topics:
        if t.name in present and t.partitions is not None and present[t.name] != t.partitions:
            log.info("output topic %s exists with %d partitions (declared %d): used as it is", t.name,
                     present[t.name], t.partitions)
    missing = [t for t in topics if t.name not in present]
    # 2. create those with a partition count
    create = [t for t in missing if t.partitions is not None]
    if create:
        new = [NewTopic(t.name, num_partitions=t.partitions or 1, replication_factor=-1) for t in create]
        futures = admin.create_topics(new)
        for t in create:
            try:
                futures[t.name].result(timeout_s)
                log.info("created output topic %s with %d partitions", t.name, t.partitions)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                    raise
        deadline = time.monotonic() + timeout_s
        while True:
            present = _present(admin, timeout_s)
            waiting = [t.name for t in create if present.get(t.name, 0) < (t.partitions or 1)]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"output topic(s) {', '.join(waiting)} created but not listed with "
                                   f"their partitions after {timeout_s:g}s")
            time.sleep(0.05)
    # 3. the rest refuse the start
    return [t.name for t in missing if t.partitions is None]


def missing_message(missing: Sequence[str], bootstrap: str) -> str:
    """The one line a worker stops with when declared output topics are missing."""
    first = missing[0]
    return (f"output topic(s) {', '.join(missing)} do not exist on {bootstrap}: create them first, or "
            f"give a partition count for the worker to create them (--output-topic {first}:PARTITIONS, "
            f"App(output_topic=\"{first}:PARTITIONS\"))")
