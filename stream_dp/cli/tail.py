"""``stream-dp tail``: print released aggregates from an output topic."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
import warnings

import orjson

from stream_dp.cli.release_format import HEADER, format_row
from stream_dp.config import Settings

__all__ = ["HEADER", "format_row", "register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tail", help="print released aggregates from an output topic",
        description="Print release records of an output topic as a table (or JSON lines).",
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--from-beginning", action="store_true", help="start at the oldest record")
    parser.add_argument("--json", action="store_true", help="print the raw JSON records")
    parser.add_argument("--max", type=int, default=0, help="stop after this many records (default: never)")
    parser.add_argument("--timeout", type=float, default=0.0, help="stop after this many seconds without a record")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        args.topic, **Settings().kafka_client_options(),
        group_id=None, client_id=f"stream-dp-tail-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest" if args.from_beginning else "latest", enable_auto_commit=False,
    )
    shown = 0
    last = time.monotonic()
    if not args.json:
        print(HEADER)
    try:
        while True:
            batch = consumer.poll(timeout_ms=500)
            for records in batch.values():
                for message in records:
                    last = time.monotonic()
                    if args.json:
                        print(message.value.decode())
                    else:
                        try:
                            print(format_row(orjson.loads(message.value)))
                        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                            print(f"(not a release record: {message.value[:80]!r})")
                    shown += 1
                    if args.max and shown >= args.max:
                        return 0
            sys.stdout.flush()
            if args.timeout and time.monotonic() - last > args.timeout:
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        consumer.close()
