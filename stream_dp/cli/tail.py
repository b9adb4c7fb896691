"""``stream-dp tail``: print released aggregates from an output topic."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
import warnings

import orjson

from stream_dp.config import Settings


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


def _num(value, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width},.{digits}f}"


HEADER = f"{'window start':<24} {'group':<24} {'count':>9} {'±95%':>8} {'sum':>12} {'±95%':>10} {'mean':>9} {'±95%':>8} {'eps':>6}"


def format_row(record: dict) -> str:
    group = ",".join(str(v) for v in record["group"].values())
    ci = record["ci95"]
    count = record["count"]
    return (
        f"{record['window']['start']:<24} {group[:24]:<24} {('-' if count is None else count):>9} {_num(ci['count'], 8)} "
        f"{_num(record['sum'], 12)} {_num(ci['sum'], 10)} {_num(record['mean'], 9, 2)} {_num(ci['mean'], 8, 2)} "
        f"{record['privacy']['epsilon']:>6g}"
    )


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
