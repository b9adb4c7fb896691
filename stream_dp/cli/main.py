"""Entry point of the ``stream-dp`` command.

Each subcommand lives in its own module and registers itself through
``add_parser``; this module only wires them together, so importing it does
no work beyond building the argument parser when ``main`` is called.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from stream_dp.cli import acls, budget, check_config, export, plan, produce, run, schema, tail
from stream_dp.worker.guard.process import make_undumpable

SUBCOMMANDS = ("run", "check-config", "plan", "produce", "tail", "export", "budget", "schema", "acls")


def _not_implemented(args: argparse.Namespace) -> int:
    print(f"stream-dp {args.command}: not implemented yet", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-dp",
        description="Streaming differential-privacy aggregation worker.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    helps = {
        "run": "run the worker: consume events, release noisy window aggregates",
        "check-config": "validate a query configuration file",
        "plan": "show noise scales, accuracy and budget use of each query",
        "produce": "publish events (from a file or synthetic) keyed by privacy unit",
        "tail": "print released aggregates from an output topic",
        "export": "serve the latest releases of each query as Prometheus metrics",
        "budget": "inspect or reset per-unit privacy budgets",
        "schema": "print the query file's JSON Schema (or its reference page)",
        "acls": "print (or apply) the Kafka and Redis ACLs of the worker, producers and analysts",
    }
    registered = {
        "run": run.register,
        "check-config": check_config.register,
        "plan": plan.register,
        "produce": produce.register,
        "tail": tail.register,
        "export": export.register,
        "budget": budget.register,
        "schema": schema.register,
        "acls": acls.register,
    }
    for name in SUBCOMMANDS:
        if name in registered:
            registered[name](sub)
            continue
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        p.set_defaults(handler=_not_implemented)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Every command may hold secrets in its environment (the contribution secret, Redis and Kafka
    # passwords): no other process of this user, a sample-and-aggregate function among them, may read them.
    make_undumpable()
    return int(args.handler(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
