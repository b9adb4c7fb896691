"""``stream-dp check-config FILE``: validate a query file and summarise it.

The file is built exactly as ``stream-dp run`` builds it (``build_worker_parts``),
so a file this command accepts cannot be refused by the worker at start-up.
"""

from __future__ import annotations

import argparse
import os
import sys

from stream_dp.cli.plan import mechanism_label
from stream_dp.config import ConfigError, format_duration_ms, load_config

RETENTION_ENV = "STREAM_DP_INPUT_RETENTION_MS"

# The worker's contribution secret only seeds which events are kept; it cannot make a file
# valid or invalid, so the check builds with a stand-in and needs no secret from the environment.
STAND_IN_SECRET = b"check-config stand-in secret"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-config",
        help="validate a query configuration file",
        description="Validate a query configuration file as the worker builds it; exit 1 and list every problem "
        "when it is invalid.",
    )
    parser.add_argument("config", metavar="FILE", help="query configuration YAML")
    parser.add_argument(
        "--input-retention-ms",
        type=int,
        default=None,
        help=f"the workers' input retention, which bounds the budget buckets a unit keeps "
        f"(default: ${RETENTION_ENV}, else Kafka's default of 7 days)",
    )
    parser.set_defaults(handler=run)


def _input_retention_ms(args: argparse.Namespace) -> int:
    """The retention the workers run with: the option, else the environment a worker would read."""
    from stream_dp.budget.store import DEFAULT_INPUT_RETENTION_MS
    from stream_dp.config.settings import HOUR_MS

    if args.input_retention_ms is not None:
        retention, named = args.input_retention_ms, "--input-retention-ms"
    elif (raw := os.environ.get(RETENTION_ENV)) is not None:
        named = RETENTION_ENV
        try:
            retention = int(raw)
        except ValueError:
            raise ValueError(f"{RETENTION_ENV}={raw!r} is not a whole number of milliseconds; fix or unset it") from None
    else:
        return DEFAULT_INPUT_RETENTION_MS
    if retention < HOUR_MS:  # a worker refuses these settings (stream_dp.config.settings)
        raise ValueError(f"{named}={retention} is under an hour, which no worker runs with; give the input topics' retention.ms")
    return retention


def run(args: argparse.Namespace) -> int:
    from stream_dp.budget import StoreOptions
    from stream_dp.cli.plan_expected import expected_errors, warning_lines
    from stream_dp.config.topic_roles import PREFIX_ENV, environment_prefix, internal_topics
    from stream_dp.worker.assemble.runtimes import build_worker_parts
    from stream_dp.worker.kafka.input_clock import clock_summary
    from stream_dp.worker.query.costs import build_plan

    try:
        retention_ms = _input_retention_ms(args)
    except ValueError as exc:
        print(f"stream-dp check-config: {exc}", file=sys.stderr)
        return 2
    prefix = environment_prefix(os.environ)
    try:
        config = load_config(args.config)
        build_worker_parts(
            config,
            source=args.config,
            secret=STAND_IN_SECRET,
            store_options=StoreOptions.for_input_retention(retention_ms),
            clock_ms=lambda: 0,
            internal_topic_prefix=prefix,  # as a worker run with this environment: no query topic may be one of them
        ).close()
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
            f"{sorted(query.aggregations.names())}, {mechanism_label(query)}"
        )
        for line in config.implied(query.name):
            # a setting the query left out and was given: said, so that nothing is added unseen
            print(f"  {line}")
        # what closes its windows, and what the worker will check of its input topic (not reachable from here)
        print(f"  {clock_summary(query)}")
        if query.continual is not None:
            # a silent default would drop most of an active unit's day: say what the file asks for
            windows = query.continual.max_windows_per_unit
            given = "" if "max_windows_per_unit" in query.continual.model_fields_set else ", the default"
            print(f"  continual: a unit counts in at most {windows} window(s) of each period "
                  f"(max_windows_per_unit {windows}{given}); its events in later windows of the period are "
                  f"left out, counted as stream_dp_window_units_total{{outcome=\"over_period_cap\"}}")
        if query.expected is not None:
            # the file is valid: a warning says a release would be mostly noise at the counts it expects
            checks, _ = expected_errors(query, build_plan(query))
            for line in warning_lines(query, checks, build_plan):
                print(f"  {line}")
    print(f"internal topics ({PREFIX_ENV}={prefix!r}, none of them a query's): {', '.join(internal_topics(prefix))}")
    print(f"budget buckets checked for an input retention of {format_duration_ms(retention_ms)} (see --input-retention-ms)")
    print(f"{args.config}: OK ({len(config.queries)} queries)")
    return 0
