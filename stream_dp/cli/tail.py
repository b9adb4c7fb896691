"""``stream-dp tail``: print released aggregates from output topics."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field

import orjson

from stream_dp.cli.release_format import HEADER, format_row
from stream_dp.config import Settings

__all__ = ["HEADER", "format_row", "register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tail", help="print released aggregates from output topics",
        description="Print release records of output topics as a table (or JSON lines). With several topics, "
        "each topic's first --windows windows are printed together, under the topic's name, once they are out.",
    )
    parser.add_argument("--topic", required=True, action="append",
                        help="an output topic; repeat it to read several (then give --windows)")
    parser.add_argument("--from-beginning", action="store_true", help="start at the oldest record")
    parser.add_argument("--json", action="store_true", help="print the raw JSON records")
    parser.add_argument("--max", type=int, default=0, help="one topic: stop after this many records (default: never)")
    parser.add_argument("--timeout", type=float, default=0.0, help="stop after this many seconds without a record")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop after this many seconds in all, printing what each topic has (default: never)")
    parser.add_argument("--windows", type=int, default=0,
                        help="stop after the records of this many windows of each topic (default: never): at the "
                             "first record of a further window, or once no more records come")
    parser.set_defaults(handler=run)


@dataclass
class _Topic:
    """What one topic showed so far: its records, the windows they are of, whether a further window began."""

    values: list[bytes] = field(default_factory=list)
    windows: set[int] = field(default_factory=set)
    further: bool = False


def run(args: argparse.Namespace) -> int:
    topics = list(dict.fromkeys(args.topic))
    if len(topics) > 1 and args.windows < 1:
        print("several --topic need --windows N: each topic's first N windows are printed together",
              file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        *topics, **Settings().kafka_client_options(),
        group_id=None, client_id=f"stream-dp-tail-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest" if args.from_beginning else "latest", enable_auto_commit=False,
    )
    try:
        if len(topics) == 1:
            return _stream(consumer, args)
        return _by_topic(consumer, topics, args)
    except KeyboardInterrupt:
        return 0
    finally:
        consumer.close()


def _line(value: bytes, as_json: bool) -> str:
    if as_json:
        return value.decode()
    try:
        return format_row(orjson.loads(value))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return f"(not a release record: {value[:80]!r})"


def _take(shown: _Topic, value: bytes, windows: int) -> bool:
    """Keep ``value`` unless it begins a window beyond the first ``windows``; whether it was kept."""
    if windows:
        start_ms = _window_start(value)
        if start_ms is not None and start_ms not in shown.windows:
            if len(shown.windows) >= windows:
                shown.further = True
                return False
            shown.windows.add(start_ms)
    shown.values.append(value)
    return True


def _out_of_time(args: argparse.Namespace, started: float, last: float) -> bool:
    now = time.monotonic()
    return bool(args.timeout and now - last > args.timeout or args.max_seconds and now - started > args.max_seconds)


def _stream(consumer, args: argparse.Namespace) -> int:
    """One topic: each record printed as it comes."""
    shown = _Topic()
    started = last = time.monotonic()
    if not args.json:
        print(HEADER)
    while True:
        batch = consumer.poll(timeout_ms=500)
        if args.windows and len(shown.windows) >= args.windows and not batch:
            return 0  # a window's records are published together: none came after the last one's
        for records in batch.values():
            for message in records:
                last = time.monotonic()
                if not _take(shown, message.value, args.windows):
                    return 0
                print(_line(message.value, args.json))
                if args.max and len(shown.values) >= args.max:
                    return 0
        sys.stdout.flush()
        if _out_of_time(args, started, last):
            return 0


def _by_topic(consumer, topics: list[str], args: argparse.Namespace) -> int:
    """Several topics: each one's first ``args.windows`` windows printed together once they are out."""
    pending = {topic: _Topic() for topic in topics}
    started = last = time.monotonic()
    while pending:
        batch = consumer.poll(timeout_ms=500)
        arrived = set()
        for tp, records in batch.items():
            shown = pending.get(tp.topic)
            if shown is None:
                continue
            arrived.add(tp.topic)
            last = time.monotonic()
            for message in records:
                if not _take(shown, message.value, args.windows):
                    break
        for topic, shown in list(pending.items()):
            # a window's records are published together: none came for the last one in this poll
            if shown.further or len(shown.windows) >= args.windows and topic not in arrived:
                _print_topic(topic, shown, args, started)
                del pending[topic]
                consumer.pause(*[tp for tp in consumer.assignment() if tp.topic == topic])
        if pending and _out_of_time(args, started, last):
            for topic, shown in pending.items():
                _print_topic(topic, shown, args, started)
            return 0
    return 0


def _print_topic(topic: str, shown: _Topic, args: argparse.Namespace, started: float) -> None:
    count = len(shown.windows)
    of = (f"{count} window{'s' if count != 1 else ''}" + ("" if count >= args.windows else
          f", of the {args.windows} asked for, within the time"))
    print(f"releases on {topic} ({of}, {time.monotonic() - started:.0f} s after tail began):")
    if not args.json and shown.values:
        print(HEADER)
    for value in shown.values:
        print(_line(value, args.json))
    sys.stdout.flush()


def _window_start(value: bytes) -> int | None:
    """The start of the window a release record is of; None for anything else."""
    try:
        start_ms = orjson.loads(value)["window"]["start_ms"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return start_ms if isinstance(start_ms, int) else None
