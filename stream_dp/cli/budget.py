"""``stream-dp budget``: inspect or reset per-unit privacy budgets.

``budget show --namespace NS UNIT``, ``budget top --namespace NS [-n 20]`` and
``budget reset --namespace NS UNIT --yes``. The namespace policies come from
the query file (``--config``); Redis from ``--redis-url`` or ``REDIS_URL``; the
input retention (which sets the accepted delay, as in the worker) from
``--input-retention-ms`` or ``STREAM_DP_INPUT_RETENTION_MS``.
Resetting a unit forgets its spending, which voids the privacy bound for that
unit over intervals spanning the reset: it refuses without ``--yes`` and is
logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any, TextIO

from stream_dp.budget import BudgetError, BudgetStore, RedisBudgetStore, StoreOptions, policy_from_config
from stream_dp.budget.policy import format_duration_ms
from stream_dp.budget.store import DEFAULT_INPUT_RETENTION_MS

logger = logging.getLogger("stream_dp.budget.admin")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "budget",
        help="inspect or reset per-unit privacy budgets",
        description="Inspect or reset per-unit privacy budgets kept in Redis.",
    )
    actions = parser.add_subparsers(dest="budget_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", required=True, metavar="FILE", help="query configuration YAML (namespace policies)")
        p.add_argument("--namespace", required=True, help="privacy-unit namespace, e.g. users")
        p.add_argument("--redis-url", default=None, help=f"Redis URL, redis+cluster://host:port,... for a Redis Cluster (default: $REDIS_URL, else {DEFAULT_REDIS_URL})")
        p.add_argument("--key-prefix", default="dp:", help="key prefix the workers use (default: dp:)")
        p.add_argument(
            "--input-retention-ms",
            type=int,
            default=None,
            help=f"the workers' input retention (default: $STREAM_DP_INPUT_RETENTION_MS, else {DEFAULT_INPUT_RETENTION_MS})",
        )

    show = actions.add_parser("show", help="a unit's spend on each horizon", description="Show a unit's spend.")
    common(show)
    show.add_argument("unit", metavar="UNIT", help="the unit id, e.g. a user_id")
    show.add_argument("--at-ms", type=int, default=None, help="event time to report at (default: now)")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=_handle(show_budget))

    top = actions.add_parser("top", help="units with the highest spend fraction", description="List top spenders.")
    common(top)
    top.add_argument("-n", type=int, default=20, help="how many units (default: 20)")
    top.add_argument("--at-ms", type=int, default=None, help="event time to report at (default: now)")
    top.add_argument("--json", action="store_true", help="print JSON instead of a table")
    top.set_defaults(handler=_handle(top_budget))

    reset = actions.add_parser(
        "reset",
        help="forget a unit's spending (administrative override)",
        description="Forget a unit's spending. This voids the privacy bound for the unit; it needs --yes.",
    )
    common(reset)
    reset.add_argument("unit", metavar="UNIT", help="the unit id, e.g. a user_id")
    reset.add_argument("--yes", action="store_true", help="confirm the reset")
    reset.set_defaults(handler=_handle(reset_budget))
    return parser


def _handle(command: Any) -> Any:
    """A handler that builds the store from the arguments, runs ``command`` and closes the store."""

    def handler(args: argparse.Namespace) -> int:
        if command is reset_budget and not args.yes:
            return reset_budget(args, None, sys.stdout)
        try:
            store = open_store(args)
        except (OSError, ValueError) as error:
            print(f"stream-dp budget: {error}", file=sys.stderr)
            return 1
        try:
            return int(command(args, store, sys.stdout))
        except (BudgetError, KeyError) as error:
            print(f"stream-dp budget: {error.args[0] if error.args else error}", file=sys.stderr)
            return 1
        finally:
            store.close()

    return handler


def open_store(args: argparse.Namespace) -> RedisBudgetStore:
    """The Redis store named by ``--redis-url``/``REDIS_URL``, with the policies of ``--config``."""
    from stream_dp.config import load_config

    policy = policy_from_config(load_config(args.config))
    url = args.redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    retention = args.input_retention_ms
    if retention is None:
        retention = int(os.environ.get("STREAM_DP_INPUT_RETENTION_MS", DEFAULT_INPUT_RETENTION_MS))
    # The same options as the worker's, so that this store reads and resets what the workers wrote.
    options = StoreOptions.for_input_retention(retention)
    return RedisBudgetStore.from_url(url, policy, options, key_prefix=args.key_prefix)


def _now_ms(args: argparse.Namespace) -> int:
    return args.at_ms if args.at_ms is not None else time.time_ns() // 1_000_000


def show_budget(args: argparse.Namespace, store: BudgetStore, out: TextIO) -> int:
    """Spent, limit, remaining and used fraction of every limit (epsilon or rho, and delta) of the unit."""
    policy = store.policy.namespace(args.namespace)
    report = store.spend(args.namespace, args.unit, _now_ms(args))
    if args.json:
        rows = [
            {
                "horizon": h.label,
                "horizon_ms": h.horizon_ms,
                "currency": h.currency,
                "spent": h.spent,
                "limit": h.limit,
                "remaining": h.remaining,
                "fraction": h.fraction,
                "epsilon": h.epsilon,
                "delta": h.delta,
            }
            for h in report
        ]
        json.dump(
            {"namespace": args.namespace, "unit": args.unit, "accounting": policy.accounting, "horizons": rows}, out
        )
        out.write("\n")
        return 0
    print(f"namespace {args.namespace} ({policy.accounting}), unit {args.unit}", file=out)
    header = f"{'horizon':>8}  {'currency':>8}  {'spent':>12}  {'limit':>12}  {'remaining':>12}  {'used':>7}"
    if policy.accounting == "rho":
        header += f"  {'epsilon':>10} (delta={policy.report_delta:g})"
    print(header, file=out)
    for h in report:
        # delta amounts are tiny: print them in exponent form
        number = "{:>12.4e}" if h.currency == "delta" else "{:>12.6f}"
        line = (f"{format_duration_ms(h.horizon_ms):>8}  {h.currency:>8}  {number.format(h.spent)}  "
                f"{number.format(h.limit)}  {number.format(h.remaining)}  {h.fraction:>7.1%}")
        if h.currency == "rho":
            line += f"  {h.epsilon:>10.6f}"
        print(line, file=out)
    return 0


def top_budget(args: argparse.Namespace, store: BudgetStore, out: TextIO) -> int:
    if args.n < 1:
        print("stream-dp budget top: -n must be at least 1", file=sys.stderr)
        return 2
    rows = store.top(args.namespace, args.n, _now_ms(args))
    if args.json:
        json.dump([{"unit": unit, "fraction": fraction} for unit, fraction in rows], out)
        out.write("\n")
        return 0
    if not rows:
        print(f"no unit of namespace {args.namespace} is near its limit", file=out)
        return 0
    print(f"{'rank':>4}  {'used':>7}  unit", file=out)
    for rank, (unit, fraction) in enumerate(rows, start=1):
        print(f"{rank:>4}  {fraction:>7.1%}  {unit}", file=out)
    return 0


def reset_budget(args: argparse.Namespace, store: BudgetStore | None, out: TextIO) -> int:
    if not args.yes:
        print(
            f"refusing to reset unit {args.unit!r} of namespace {args.namespace}: resetting forgets its spending and "
            "voids its privacy bound; add --yes to confirm",
            file=sys.stderr,
        )
        return 2
    assert store is not None
    store.policy.namespace(args.namespace)
    existed = store.reset(args.namespace, args.unit)
    logger.warning("budget reset: namespace=%s unit=%r had_spending=%s", args.namespace, args.unit, existed)
    if existed:
        print(f"reset unit {args.unit!r} of namespace {args.namespace}", file=out)
    else:
        print(f"unit {args.unit!r} of namespace {args.namespace} had no recorded spending", file=out)
    return 0
