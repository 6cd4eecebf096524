"""``multilane state get|dump``: read state back, from a worker's state directory or from a changelog
topic, as JSON lines. Does I/O (RocksDB read-only, or a Kafka consumer).

Sources:

- ``--state-dir DIR``: the per-partition RocksDB stores (``<dir>/<topic>-<partition>/db``), opened
  read-only (a running worker may hold them; the read is then a snapshot of what it flushed).
- ``--changelog TOPIC --bootstrap-servers B``: every partition of the changelog topic
  (``<group>.<input topic>.changelog``) read from its start to its end; the newest change of each key
  wins and deletes remove it. This is the changelog's view: it includes changes of records still in
  flight, which a restore would not apply yet (``docs/state.md``).

Each line: ``{"partition": P, "key": K, "value": V}`` with key and value shown in ``--key-format`` /
``--value-format``: ``auto`` (JSON if it parses, else UTF-8 text, else ``{"base64": ...}``), ``json``,
``str``, ``bytes`` (always ``{"base64": ...}``) or a ``module:callable`` hook (its result must be JSON
serialisable). ``get KEY`` prints one line, or exits 1 with one line on stderr when the key is absent.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from multilane.codecs import CodecError, load_codec
from multilane.extras import MissingExtraError, require

__all__ = ["add_arguments", "read_changelog", "read_state_dir", "render", "run", "show"]

Entry = tuple[int, bytes, bytes]  # (partition, key, value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    get = sub.add_parser("get", help="print one key's value",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    get.add_argument("key", help="the state key (UTF-8 text, or hex with --key-hex)")
    get.add_argument("--key-hex", action="store_true", help="KEY is hexadecimal bytes")
    dump = sub.add_parser("dump", help="print every key and value",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for p in (get, dump):
        p.add_argument("--state-dir", default=None,
                       help="read a worker's state directory (of a stopped worker: while one runs, only "
                            "what it flushed to disk; use --changelog then)")
        p.add_argument("--changelog", default=None, metavar="TOPIC",
                       help="read a changelog topic instead (<group>.<topic>.changelog)")
        p.add_argument("--bootstrap-servers", default=None, help="Kafka bootstrap servers (with --changelog)")
        p.add_argument("--topic", default=None, help="with --state-dir: only this input topic's stores")
        p.add_argument("--partition", type=int, default=None, help="only this partition")
        p.add_argument("--key-format", default="auto", help="how keys are shown (auto, json, str, bytes, "
                       "module:callable)")
        p.add_argument("--value-format", default="auto", help="how values are shown (as --key-format)")
        p.add_argument("--timeout-s", type=float, default=30.0,
                       help="with --changelog: give up on a partition after this long")


# -- rendering (pure) --------------------------------------------------------------------------------

def show(data: bytes | None, fmt: str) -> Any:
    """``data`` as a JSON-serialisable value in format ``fmt`` (module docstring)."""
    if data is None:
        return None
    if fmt == "bytes":
        return {"base64": base64.b64encode(data).decode()}
    if fmt == "auto":
        try:
            return json.loads(data)
        except ValueError:
            pass
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(data).decode()}
    try:
        return load_codec(fmt).decode(data)
    except Exception:  # an undecodable entry is still shown, never dropped
        return {"base64": base64.b64encode(data).decode(), "error": f"not {fmt}"}


def render(entry: Entry, key_format: str, value_format: str) -> str:
    partition, key, value = entry
    return json.dumps({"partition": partition, "key": show(key, key_format),
                       "value": show(value, value_format)}, ensure_ascii=False, default=str)


# -- sources (I/O) -----------------------------------------------------------------------------------

def read_state_dir(state_dir: str, topic: str | None = None, partition: int | None = None) -> Iterator[Entry]:
    """Every key of the stores under ``state_dir`` (read-only), store by store, in key order."""
    from rocksdict import AccessType, Options, Rdict

    root = Path(state_dir)
    if not root.is_dir():
        raise ValueError(f"state directory {state_dir} does not exist")
    for d in sorted(root.iterdir()):
        name, sep, part = d.name.rpartition("-")
        if not sep or not part.isdigit() or not (d / "db").is_dir():
            continue
        if (topic is not None and name != topic) or (partition is not None and int(part) != partition):
            continue
        db = Rdict(str(d / "db"), Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            it = db.iter()
            it.seek_to_first()
            while it.valid():
                yield int(part), bytes(it.key()), bytes(it.value())
                it.next()
        finally:
            db.close()


def read_changelog(bootstrap: str, topic: str, partition: int | None = None,
                   timeout_s: float = 30.0) -> Iterator[Entry]:
    """The state a changelog topic holds: per partition, the newest change of each key (steps 1-2).

    1. Find the topic's partitions (a missing topic is a one-line ValueError).
    2. Read each from its start to the end-of-partition event, applying puts and deletes in order.
    """
    from confluent_kafka import Consumer

    from multilane.worker.state.reader import ChangelogReader, reader_consumer_config

    # 1. partitions
    probe = Consumer(reader_consumer_config(bootstrap, topic))
    try:
        # every topic's metadata, not the one topic's: a broker that auto-creates topics would create
        # the changelog on that request (with its default partition count) before the worker does
        meta = probe.list_topics(timeout=timeout_s).topics.get(topic)
    finally:
        probe.close()
    if meta is None or meta.error is not None or not meta.partitions:
        raise ValueError(f"changelog topic {topic} does not exist on {bootstrap}")
    # 2. read each partition to its end
    for p in sorted(meta.partitions):
        if partition is not None and p != partition:
            continue
        reader = ChangelogReader(bootstrap, topic, p, input_topic=topic)
        state: dict[bytes, bytes] = {}
        try:
            reader.seek(0)
            deadline = time.monotonic() + timeout_s
            while True:
                batch = reader.read(0.2)
                for e in batch.entries:
                    if e.value is None:
                        state.pop(e.key, None)
                    else:
                        state[e.key] = e.value
                if batch.eof:
                    break
                if time.monotonic() > deadline:
                    raise ValueError(f"no end of {topic}[{p}] within {timeout_s}s")
        finally:
            reader.close()
        for key in sorted(state):
            yield p, key, state[key]


def _entries(args: argparse.Namespace) -> Iterator[Entry]:
    if bool(args.state_dir) == bool(args.changelog):
        raise ValueError("give one of --state-dir DIR or --changelog TOPIC")
    if args.state_dir:
        require("state", for_what="multilane state --state-dir")
        return read_state_dir(args.state_dir, args.topic, args.partition)
    if not args.bootstrap_servers:
        raise ValueError("--changelog needs --bootstrap-servers")
    return read_changelog(args.bootstrap_servers, args.changelog, args.partition, args.timeout_s)


def run(args: argparse.Namespace) -> int:
    try:
        for fmt in (args.key_format, args.value_format):
            if fmt != "auto":
                load_codec(fmt)
        wanted: bytes | None = None
        if args.action == "get":
            wanted = bytes.fromhex(args.key) if args.key_hex else args.key.encode()
        found = False
        for entry in _entries(args):
            if wanted is not None and entry[1] != wanted:
                continue
            print(render(entry, args.key_format, args.value_format), flush=wanted is None)
            found = True
    except (ValueError, CodecError, MissingExtraError) as exc:
        print(f"multilane state: {exc}", file=sys.stderr)
        return 2
    if wanted is not None and not found:
        print(f"multilane state: key {args.key!r} not found", file=sys.stderr)
        return 1
    return 0
