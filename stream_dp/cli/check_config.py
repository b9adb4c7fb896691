"""``stream-dp check-config FILE``: validate a query file and summarise it."""

from __future__ import annotations

import argparse
import sys

from stream_dp.config import ConfigError, format_duration_ms, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-config",
        help="validate a query configuration file",
        description="Validate a query configuration file; exit 1 and list every problem when it is invalid.",
    )
    parser.add_argument("config", metavar="FILE", help="query configuration YAML")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    for name, namespace in config.namespaces.items():
        limits = ", ".join(
            f"{b.limit:g} {namespace.accounting} per {format_duration_ms(b.horizon_ms)}" for b in namespace.budgets
        )
        print(f"namespace {name}: {limits}; alerts at {namespace.alert_at}")
    for query in config.queries:
        groups = "public" if query.public_group_keys() is not None else "selected"
        print(
            f"query {query.name}: {query.input_topic} -> {query.output_topic}, "
            f"{format_duration_ms(query.window.size_ms)} windows, {groups} groups by {query.group_by}, "
            f"{sorted(query.aggregations.names())}, {query.mechanism} epsilon={query.epsilon:g}"
            + (f" delta={query.delta:g}" if query.delta else "")
        )
    print(f"{args.config}: OK ({len(config.queries)} queries)")
    return 0
