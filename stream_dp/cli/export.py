"""``stream-dp export --config FILE``: serve each query's latest release as Prometheus gauges."""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from stream_dp.config import ConfigError, Settings, load_config

DEFAULT_PORT = 9110  # beside the workers' 9108 (and 9109 for a second one)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="serve the latest releases of each query as Prometheus metrics",
        description="Read the output topics of the queries in --config and serve the latest release of each query "
                    "on /metrics: noisy counts, sums and means with their 95% half-widths per group, top-k ranks, "
                    "quantiles, running totals (docs/operations/releases.md).",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="query configuration YAML")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"metrics port (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="metrics address (default 127.0.0.1)")
    parser.add_argument("--max-groups", type=int, default=50, metavar="N",
                        help="queries with selected groups: show at most N groups per window, those with the "
                             "largest noisy counts (default 50); public groups are all shown")
    parser.add_argument("--lookback", type=int, default=1000, metavar="N",
                        help="at start, read each output partition's last N records to rebuild the latest "
                             "releases (default 1000)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    if args.max_groups < 1 or args.lookback < 1:
        print("--max-groups and --lookback must be 1 or more", file=sys.stderr)
        return 2
    from stream_dp.export import run_exporter

    try:
        config = load_config(args.config)
        settings = Settings()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValidationError as exc:
        print(f"invalid environment settings:\n{exc}", file=sys.stderr)
        return 1
    return run_exporter(config, settings, host=args.host, port=args.port, max_groups=args.max_groups,
                        lookback=args.lookback)
