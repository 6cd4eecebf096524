"""The ``multilane`` console script: a thin dispatcher over subcommand modules.

Each subcommand lives in its own module, imported only when that subcommand runs, and exposes:

- ``add_arguments(parser: argparse.ArgumentParser) -> None``
- ``run(args: argparse.Namespace) -> int`` (the process exit code)
- optionally ``parse_args(parser, argv) -> argparse.Namespace`` (instead of ``parser.parse_args``)

A subcommand that needs an optional extra (see :mod:`multilane.extras`) names it in :data:`COMMANDS`;
when the extra is missing the command prints one line saying which, and exits with 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from multilane.extras import MissingExtraError, extra_for_module, require

# name -> (module, one-line help, the extras it needs). Modules are imported lazily so that, say, the
# worker does not import Spark or kopf.
COMMANDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "worker": ("multilane.worker.cli", "run a worker process (engine + control endpoint + metrics)", ()),
    "loadgen": ("multilane.testing.loadgen_cli", "produce synthetic records (Zipf keys) to a topic", ()),
    "produce": ("multilane.worker.produce_cli", "send records from a file or stdin (JSON or plain lines)",
                ()),
    # --state-dir needs the 'state' extra (checked by the command); --changelog only the core install
    "state": ("multilane.worker.state.dump",
              "read state back: get KEY or dump, from --state-dir or --changelog", ()),
    "operator": ("multilane.operator.k8s.cli", "run the kopf operator", ("operator",)),
    "demo": ("multilane.demo.run", "the local demo: autoscaling with restore-before-handoff",
             ("state", "embedded", "plot")),
    "simulate": ("multilane.sim.cli", "compare autoscaling policies on simulated traces", ()),
    "snapshot": ("multilane.pipeline.cli", "build state snapshots from changelogs with PySpark",
                 ("pipeline",)),
    # --kind embedded needs the 'embedded' extra (the command says so); --kind apache needs Java + jars
    "broker": ("multilane.testing.cli",
               "run a broker in the foreground: embedded (Tansu, default) or --kind apache", ()),
    "cluster": ("multilane.testing.cluster_cli",
                "a real Kubernetes control plane on loopback: up, down, status (docs/real-cluster.md)",
                ("operator",)),
    "check-logs": ("multilane.testing.check_logs", "delivery checkers over event logs collected from pods",
                   ()),
}


def build_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="multilane", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser, sub


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, sub = build_parser()
    for name, (_module, help_text, _extras) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    name = argv[0]
    module_name, help_text, extras = COMMANDS[name]
    try:
        require(*extras, for_what=f"multilane {name}")
        module = importlib.import_module(module_name)
        cmd_parser = argparse.ArgumentParser(prog=f"multilane {name}", description=help_text,
                                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.add_arguments(cmd_parser)
        # a module may layer its own defaults under the command line (the worker's --app settings)
        parse = getattr(module, "parse_args", None)
        args = parse(cmd_parser, argv[1:]) if parse is not None else cmd_parser.parse_args(argv[1:])
        return int(module.run(args))
    except MissingExtraError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        extra = extra_for_module(exc.name or "")
        if extra is None:
            raise
        print(MissingExtraError([extra], f"multilane {name}", [exc.name or ""]), file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
