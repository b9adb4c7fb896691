"""The faust-streaming peer of the ingest stage, built the obvious faust way.

    .venv/bin/python tests/perf/faust_peer.py --bootstrap HOST:PORT --topic T --app-id ID --stop-after N

A faust agent reads the events (a ``faust.Record`` decoded by faust's JSON
codec) and keeps a tumbling one-minute windowed table, relative to the events'
own time, of per-(unit, group) counts bounded by ``max_events_per_group``
(increment only while the count in the event's window is below the bound).
The table is in memory with faust's changelog topic, as faust tables are.
This is less work than stream-dp does per event (no L0 bound, no sum, no
close, budget or noise), which favours faust in the comparison.

Progress goes to stdout as ``progress <unix time> <events>`` lines every
``--report-every`` events and ``done`` after ``--stop-after``; the harness
(``bench_peers.py``) takes the rate from them and then stops the process.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import timedelta

import faust


class Event(faust.Record, serializer="json"):
    user_id: str
    ts: int
    page: str
    value: float


def report(line: str) -> None:
    # faust's worker redirects sys.stdout into its logger; the harness reads the real stdout.
    sys.__stdout__.write(line + "\n")
    sys.__stdout__.flush()


def build_app(args: argparse.Namespace) -> faust.App:
    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        topic_partitions=args.partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        datadir=args.datadir,
    )
    events = app.topic(args.topic, value_type=Event, partitions=args.partitions)
    counts = (
        app.Table("per_unit_group", default=int, partitions=args.partitions)
        .tumbling(timedelta(seconds=60), expires=timedelta(minutes=15))
        .relative_to(lambda event: event.value.ts / 1000)  # event time, in seconds as faust expects
    )
    max_events = args.max_events
    report_every = args.report_every
    stop_after = args.stop_after

    @app.agent(events)
    async def bound_contributions(stream):  # noqa: ANN001 - faust's stream type
        seen = 0
        async for event in stream:
            window = counts[f"{event.user_id}|{event.page}"]
            if window.current() < max_events:
                window += 1
            seen += 1
            if seen % report_every == 0:
                report(f"progress {time.time():.6f} {seen}")
            if seen == stop_after:
                report("done")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-events", type=int, default=2)
    parser.add_argument("--stop-after", type=int, required=True)
    parser.add_argument("--report-every", type=int, default=5_000)
    parser.add_argument("--datadir", required=True, help="faust's data directory (a temporary one)")
    args = parser.parse_args()
    logging.getLogger("faust").setLevel(logging.WARNING)
    app = build_app(args)
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
