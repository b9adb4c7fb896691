"""``stream-dp produce``: publish events keyed by privacy unit, from a file or synthetic.

Keying by the privacy unit puts all of a unit's events in one partition, which
the worker relies on to bound each unit's contribution in one place.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson

from stream_dp.config import ConfigError, Settings, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "produce",
        help="publish events (from a file or synthetic) keyed by privacy unit",
        description="Publish JSON events to a topic, keyed by the privacy unit id.",
    )
    parser.add_argument("--topic", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="JSON lines file, one event per line")
    source.add_argument("--synthetic", type=int, metavar="N", help="generate N synthetic events")
    parser.add_argument("--units", type=int, default=10_000, help="synthetic: distinct privacy units (default 10000)")
    parser.add_argument("--groups", type=int, default=100, help="synthetic: distinct groups (default 100)")
    parser.add_argument("--rate", type=float, default=0.0, help="events per second (default: as fast as possible)")
    parser.add_argument("--time-step-ms", type=float, default=1.0,
                        help="synthetic without --rate: event-time step between events; times end at the wall clock")
    parser.add_argument("--seed", type=int, default=0, help="synthetic: random seed of the generated data")
    parser.add_argument("--config", type=Path, help="query file: take field names and public groups from --query")
    parser.add_argument("--query", help="query in --config whose fields the synthetic events use")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


class _Fields:
    def __init__(self, unit: str = "user_id", ts: str = "ts", group: str = "page", value: str | None = "value",
                 public: list | None = None) -> None:
        self.unit, self.ts, self.group, self.value, self.public = unit, ts, group, value, public


def _fields(args: argparse.Namespace) -> _Fields:
    if not args.config:
        return _Fields()
    config = load_config(args.config)
    query = config.query(args.query) if args.query else config.queries[0]
    public = query.public_group_keys()
    return _Fields(
        unit=query.privacy_unit.field,
        ts=query.timestamp_field,
        group=query.group_by[0],
        value=query.aggregations.value_field,
        public=[k[0] for k in public] if public else None,
    )


def synthetic_events(n: int, units: int, groups: int, fields: _Fields, *, seed: int, start_ms: int,
                     step_ms: float) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) pairs of synthetic events; skewed activity, like real users."""
    rng = np.random.default_rng(seed)  # synthetic data only; never noise
    chunk = 100_000
    for base in range(0, n, chunk):
        size = min(chunk, n - base)
        unit_ids = (rng.zipf(1.3, size) - 1) % units
        group_ids = rng.integers(0, groups, size)
        values = np.round(rng.gamma(2.0, 20.0, size), 2)
        times = start_ms + ((base + np.arange(size)) * step_ms).astype(np.int64)
        for u, g, v, t in zip(unit_ids.tolist(), group_ids.tolist(), values.tolist(), times.tolist()):
            unit = f"u{u}"
            group = fields.public[g % len(fields.public)] if fields.public else f"/g{g}"
            event = {fields.unit: unit, fields.ts: t, fields.group: group}
            if fields.value:
                event[fields.value] = v
            yield unit.encode(), orjson.dumps(event)


def file_events(path: Path, unit_field: str) -> Iterator[tuple[bytes | None, bytes]]:
    with path.open("rb") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                unit = orjson.loads(line).get(unit_field)
            except (orjson.JSONDecodeError, AttributeError):
                unit = None  # sent as is: the worker rejects it with a reason
            yield (None if unit is None else str(unit).encode()), line


def run(args: argparse.Namespace) -> int:
    try:
        fields = _fields(args)
    except (ConfigError, KeyError) as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.synthetic is not None:
        if args.synthetic < 0 or args.units < 1 or args.groups < 1:
            print("--synthetic must be >= 0 and --units, --groups >= 1", file=sys.stderr)
            return 2
        now_ms = int(time.time() * 1000)
        step = 1000.0 / args.rate if args.rate > 0 else args.time_step_ms
        # Event times end at the wall clock (future times would be rejected); with
        # --rate they follow the wall clock as events are sent.
        start = now_ms if args.rate > 0 else now_ms - int(args.synthetic * step)
        events = synthetic_events(args.synthetic, args.units, args.groups, fields, seed=args.seed, start_ms=start, step_ms=step)
        total = args.synthetic
    else:
        events = file_events(args.file, fields.unit)
        total = None
    return _send(args.topic, events, total, args.rate, quiet=args.quiet)


def _send(topic: str, events, total: int | None, rate: float, *, quiet: bool) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaProducer

    producer = KafkaProducer(**Settings().kafka_client_options(), acks="all", linger_ms=20,
                             batch_size=512 * 1024, compression_type=None)
    sent = 0
    started = time.monotonic()
    last_report = 0.0
    try:
        for key, value in events:
            producer.send(topic, key=key, value=value)
            sent += 1
            if rate > 0:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            now = time.monotonic()
            if not quiet and now - last_report > 0.5:
                last_report = now
                _progress(sent, total, now - started)
        producer.flush()
    except KeyboardInterrupt:
        producer.flush()
    finally:
        producer.close()
    if not quiet:
        _progress(sent, total, time.monotonic() - started)
        print(file=sys.stderr)
    print(f"sent {sent} events to {topic} in {time.monotonic() - started:.1f}s")
    return 0


def _progress(sent: int, total: int | None, elapsed_s: float) -> None:
    speed = sent / elapsed_s if elapsed_s > 0 else 0.0
    if total:
        filled = int(30 * sent / total)
        bar = "#" * filled + "-" * (30 - filled)
        print(f"\r[{bar}] {sent}/{total} {speed:,.0f} ev/s", end="", file=sys.stderr)
    else:
        print(f"\r{sent} events {speed:,.0f} ev/s", end="", file=sys.stderr)
