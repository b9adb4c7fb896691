"""``stream-dp run --config FILE``: run a worker until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from stream_dp.config import ConfigError, Settings, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run the worker: consume events, release noisy window aggregates",
        description="Run a worker. Connections come from the environment (see docs/reference/configuration.md).",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="query configuration YAML")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument(
        "--processes", type=_positive, default=1, metavar="N",
        help="run N worker processes in the consumer group, behind one metrics endpoint (default 1)",
    )
    parser.set_defaults(handler=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, 1 or more; got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The Kafka clients log every connection at INFO.
    for name in ("kafka", "aiokafka"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    from stream_dp.worker.app import WorkerConfigError, run_worker
    from stream_dp.worker.guard.store import StoreReplaced

    try:
        config = load_config(args.config)
        settings = Settings()
        if args.processes > 1:
            from stream_dp.config.topic_roles import deployment_problem
            from stream_dp.worker.assemble.runtimes import build_worker_parts, contribution_secret
            from stream_dp.worker.supervisor import supervise

            # Refuse a bad file or environment once, here, rather than N times in the children.
            shared = deployment_problem(settings.group_id, settings.internal_topic_prefix)
            if shared:
                raise WorkerConfigError(shared)
            build_worker_parts(config, source=args.config, secret=contribution_secret(settings),
                               store_options=settings.budget_store_options(), clock_ms=lambda: 0,
                               internal_topic_prefix=settings.internal_topic_prefix)
            return supervise(["--config", args.config, "--log-level", args.log_level], args.processes,
                             host=settings.metrics_host, port=settings.metrics_port)
        return run_worker(config, settings, config_source=args.config)
    except (ConfigError, WorkerConfigError, StoreReplaced) as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValidationError as exc:
        print(f"invalid environment settings:\n{exc}", file=sys.stderr)
        return 1
