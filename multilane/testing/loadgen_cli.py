"""``multilane loadgen``: the command line over :mod:`multilane.testing.loadgen`'s producers.

Does I/O: produces to Kafka, optionally creates the topic, writes the produced set and the timeline to
files, and shows a progress bar on a terminal. Prints the run's summary as one JSON line; exit code 2
for bad arguments, 1 when a record failed.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
from collections.abc import Sequence

from multilane.progress_bar import ProgressBar
from multilane.testing.loadgen import LoadOptions, RateProfile, produce_paced, produce_records

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka bootstrap servers, HOST:PORT")
    parser.add_argument("--topic", required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--records", type=int, help="produce this many records as fast as possible")
    what.add_argument("--rate", type=float, help="records per second (with --duration)")
    what.add_argument("--profile", help='rate steps "RATExSECONDS,...", e.g. "1000x10,5000x5,0x5"')
    parser.add_argument("--duration", type=float, help="seconds, with --rate")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys (0 = null keys)")
    parser.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent (0 = uniform)")
    parser.add_argument("--value-size", type=int, default=100, help="bytes per value (>= 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partition", type=int, default=None, help="produce to this partition only")
    parser.add_argument(
        "--create-partitions", type=int, default=0, help="create the topic with this many partitions first"
    )
    parser.add_argument(
        "--producer-config", action="append", default=[], metavar="KEY=VALUE", help="extra producer settings"
    )
    parser.add_argument("--output", help="write the produced set as TSV lines: partition, offset, key hex")
    parser.add_argument(
        "--timeline",
        help="paced runs: write a JSON file with the offered and the delivered records per second, "
        "the longest delivery latency per second, the skipped count, the monotonic time of second 0 "
        "and the summary (the demo and the burst benchmark plot it)",
    )
    parser.add_argument(
        "--max-behind-s",
        type=float,
        default=1.0,
        help="paced runs: skip (and count) records due more than this many seconds ago instead of "
        "catching up in a spike; default 1",
    )


def _parse_config(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"--producer-config {item!r} must look like key=value")
        out[k] = v
    return out


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
    try:
        fut.result(30)
    except Exception as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
            raise


def run(args: argparse.Namespace) -> int:
    try:
        config = _parse_config(args.producer_config)
        if args.rate is not None:
            if args.duration is None:
                raise ValueError("--rate needs --duration")
            profile: RateProfile | None = RateProfile.constant(args.rate, args.duration)
        elif args.profile is not None:
            profile = RateProfile.parse(args.profile)
        else:
            profile = None
        if args.create_partitions:
            _create_topic(args.bootstrap_servers, args.topic, args.create_partitions)
        common: LoadOptions = {
            "keys": args.keys,
            "value_size": args.value_size,
            "zipf_s": args.zipf_s,
            "seed": args.seed,
            "partition": args.partition,
            "producer_config": config,
        }
        if profile is None:
            if args.records < 0:
                raise ValueError(f"--records must be >= 0, got {args.records}")
            with ProgressBar("producing records", total=args.records) as bar:
                result = produce_records(
                    args.bootstrap_servers, args.topic, args.records, on_progress=bar.update, **common
                )
        else:
            # SIGTERM ends a paced run early and cleanly: flush, then write the produced set
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            with ProgressBar("producing (seconds)", total=math.ceil(profile.duration_s)) as bar:
                result = produce_paced(
                    args.bootstrap_servers,
                    args.topic,
                    profile,
                    should_stop=stop.is_set,
                    max_behind_s=args.max_behind_s,
                    on_progress=bar.update,
                    **common,
                )
    except ValueError as exc:
        print(f"multilane loadgen: {exc}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w", encoding="ascii") as f:
            for r in result.records:
                f.write(f"{r.partition}\t{r.offset}\t{'-' if r.key is None else r.key.hex()}\n")
    if args.timeline:
        timeline = {
            "offered_per_s": result.offered_per_s,
            "delivered_per_s": result.delivered_per_s,
            "skipped": result.skipped,
            "latency_max_per_s": [round(x, 4) for x in result.latency_max_per_s],
            "started_monotonic": result.started_monotonic,
            "summary": result.summary(),
        }
        with open(args.timeline, "w", encoding="ascii") as f:
            json.dump(timeline, f)
    print(json.dumps(result.summary()))
    return 0 if result.failed == 0 else 1
