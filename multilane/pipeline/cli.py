"""``multilane snapshot``: build a state snapshot from changelog topics with PySpark. Does I/O.

Example::

    multilane snapshot --bootstrap-servers kafka:9092 --group orders-app --topic orders \\
        --uri s3://bucket/snapshots/orders-app --factor 8 --retain 3 --master local[*]

Prints a summary (``--json``: one JSON object as the last line); exit code 0 when the snapshot was
published, 1 when the job failed (nothing new is visible then), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from datetime import timedelta
from typing import Any

from multilane.formats.keyranges import KeyRangeMap
from multilane.pipeline.planning import parse_ranges

__all__ = ["add_arguments", "parse_kv", "read_config_dir", "run"]

log = logging.getLogger("multilane.pipeline")


def parse_kv(items: list[str] | None, what: str) -> dict[str, str]:
    """``["k=v", ...]`` -> dict (ValueError naming ``what`` on a malformed item)."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} must be KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def read_config_dir(path: str | None) -> dict[str, str]:
    """Client settings from a folder of files (a mounted Secret): file name = key, content = value."""
    if not path:
        return {}
    out: dict[str, str] = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith(".") or not os.path.isfile(full):
            continue  # Kubernetes' ..data symlink folders and the like
        with open(full, encoding="utf-8") as f:
            out[name] = f.read().strip()
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--group", required=True, help="the consumer group whose state is snapshotted")
    parser.add_argument(
        "--topic", action="append", required=True, help="input topic (repeatable or comma-separated)"
    )
    parser.add_argument("--uri", required=True, help="snapshot URI: a local path or a pyarrow URI (s3://...)")
    parser.add_argument("--partitions", default="", help="only these partitions, e.g. 0,1,5 (default all)")
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument("--factor", type=int, default=1, help="shard by KeyRangeMap.even(F) (default 1)")
    layout.add_argument(
        "--ranges", default="", help="shard by explicit ranges START:END,... tiling [0, 2**32)"
    )
    # the job's fault window for tests (killed between writing the data and publishing): not in --help
    parser.add_argument("--pause-before-publish-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--retain", type=int, default=3, help="keep the newest N snapshots (default 3)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--spark-conf", action="append", metavar="KEY=VALUE", help="extra Spark settings")
    parser.add_argument(
        "--max-records-per-task", type=int, default=1_000_000, help="offset range size (default 1,000,000)"
    )
    parser.add_argument("--write-tasks", type=int, default=0, help="Spark tasks writing files (0: 2 x cores)")
    parser.add_argument(
        "--source-bound",
        choices=["committed", "none"],
        default="committed",
        help="bound each partition by the group's committed input offset (default), or cover everything",
    )
    parser.add_argument(
        "--staging-grace-s", type=float, default=3600.0, help="age after which unpublished leftovers go"
    )
    parser.add_argument("--consumer-config", action="append", metavar="KEY=VALUE", help="extra client config")
    parser.add_argument(
        "--consumer-config-dir", help="folder of client settings (file name = key), e.g. a Secret"
    )
    parser.add_argument("--idle-timeout-s", type=float, default=60.0, help="fail a read stalled this long")
    parser.add_argument(
        "--dry-run", action="store_true", help="plan only: print extents and ranges, no Spark"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line at the end")
    parser.add_argument("--log-level", default="INFO")


def _layout(args: argparse.Namespace) -> KeyRangeMap:
    return parse_ranges(args.ranges) if args.ranges else KeyRangeMap.even(args.factor)


def run(args: argparse.Namespace) -> int:
    from multilane.pipeline.job import SnapshotJob, SnapshotJobConfig, spark_session
    from multilane.pipeline.planning import OffsetRangePlanner

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        topics = tuple(t.strip() for item in args.topic for t in item.split(",") if t.strip())
        partitions = tuple(int(p) for p in args.partitions.split(",") if p.strip()) or None
        kafka_config = {
            **read_config_dir(args.consumer_config_dir),
            **parse_kv(args.consumer_config, "--consumer-config"),
        }
        config = SnapshotJobConfig(
            bootstrap=args.bootstrap_servers,
            group=args.group,
            topics=topics,
            uri=args.uri,
            layout=_layout(args),
            partitions=partitions,
            retain=args.retain,
            max_records_per_task=args.max_records_per_task,
            source_bound=args.source_bound,
            kafka_config=kafka_config,
            staging_grace=timedelta(seconds=args.staging_grace_s),
            write_tasks=args.write_tasks or None,
            idle_timeout_s=args.idle_timeout_s,
            pause_before_publish_s=args.pause_before_publish_s,
        )
        spark_conf = parse_kv(args.spark_conf, "--spark-conf")
    except (ValueError, OSError) as exc:
        print(f"multilane snapshot: {exc}", file=sys.stderr)
        return 2
    job = SnapshotJob(config)
    summary: dict[str, Any]
    try:
        if args.dry_run:
            extents = job.plan_extents()
            ranges = OffsetRangePlanner(config.max_records_per_task).plan(extents)
            summary = {
                "dry_run": True,
                "extents": [dataclasses.asdict(e) for e in extents],
                "ranges": len(ranges),
            }
        else:
            spark = spark_session(args.master, conf=spark_conf)
            try:
                summary = job.run(spark).summary()
            finally:
                spark.stop()
    except Exception as exc:
        log.exception("snapshot failed")
        print(f"multilane snapshot: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0
