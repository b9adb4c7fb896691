"""``stream-dp produce``: publish events keyed by privacy unit, from a file or synthetic.

Keying by the privacy unit id (its UTF-8 bytes) with the query's partitioner
and no explicit partition puts all of a unit's events in one partition, where
the worker bounds the unit's contribution; the worker dead-letters events
keyed or placed otherwise. A topic that does not exist yet is created as input
topics should be: with ``message.timestamp.type=LogAppendTime``, so that the
broker stamps each record and its windows close by the broker's clock
(docs/privacy/clock.md). On a ``CreateTime`` topic each record's Kafka timestamp
is, by default, the event's own time (``--record-time event``): a backfill read
by queries with ``trust_producer_timestamps: true`` then closes windows as its
times advance. ``--record-time now`` leaves the timestamp to the client (the
send time). Topic creation, the partitioners and the local-DP reports are those of
``stream_dp.producer`` (``EventProducer``, for applications); unlike ``EventProducer.send``, a ``--file``
line is sent as it is, for the worker to dead-letter if it is not a valid event.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson

from stream_dp.cli.local_reports import chosen_query, local_reports
from stream_dp.config import ConfigError, QueryConfig, Settings, load_config
from stream_dp.producer.topic import KeyedSender
from stream_dp.windows.timestamps import to_epoch_ms


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
    parser.add_argument("--record-time", choices=("event", "now"), default="event",
                        help="Kafka record timestamp on a CreateTime topic: the event's time (default; for backfills "
                             "read with trust_producer_timestamps: true) or the send time; a LogAppendTime topic "
                             "(how a missing topic is created) gets the broker's time either way")
    parser.add_argument("--partitioner", choices=("murmur2", "crc32"),
                        help="how keys map to partitions (default: the --query's partitioner, else murmur2)")
    parser.add_argument("--local-dp", metavar="FIELD",
                        help="send, instead of each event, only its unit id, its time and FIELD randomized with the "
                             "--query's local_dp randomizer (tagged with it), at most one report per unit per window, "
                             "so that no true value leaves this process; required for a query with local_dp and for "
                             "its input topic")
    parser.add_argument("--local-dp-secret-file", type=Path, metavar="FILE",
                        help="--local-dp: the producer's secret key (16+ bytes; create it once with "
                             "`head -c 32 /dev/urandom > FILE`, keep it, never send it), from which each report is "
                             "drawn, so a re-run sends the same reports; or set STREAM_DP_LOCAL_DP_SECRET")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


class _Fields:
    """The event fields synthetic events fill: ``group_by`` holds every grouping field, and ``public`` whole
    group keys (one value per grouping field), so that every event carries a field of each; ``values`` the
    numeric fields, ``vector`` the fields of a mean vector or covariance (correlated readings around
    ``vector_means``, by default 0, 1, 2, ...)."""

    def __init__(self, unit: str = "user_id", ts: str = "ts", group_by: tuple[str, ...] = ("page",),
                 values: tuple[str, ...] = ("value",), public: list[tuple] | None = None,
                 timestamp_format: str = "auto", partitioner: str = "murmur2", vector: tuple[str, ...] = (),
                 vector_means: tuple[float, ...] | None = None) -> None:
        self.unit, self.ts, self.group_by, self.values, self.public = unit, ts, group_by, values, public
        self.timestamp_format, self.partitioner, self.vector = timestamp_format, partitioner, vector
        self.vector_means = tuple(float(i) for i in range(len(vector))) if vector_means is None else vector_means


# What every query reading one topic must agree on for one synthetic event to fit them all.
_SHARED = {"privacy_unit.field": lambda q: q.privacy_unit.field, "timestamp_field": lambda q: q.timestamp_field,
           "timestamp_format": lambda q: q.timestamp_format, "group_by": lambda q: tuple(q.group_by),
           "groups.public": lambda q: q.public_group_keys(), "partitioner": lambda q: q.partitioner}


def _queries_filled(args: argparse.Namespace) -> list[QueryConfig]:
    """The --query, or without it every query of --config reading --topic: synthetic events fit them all."""
    if args.query:
        return [chosen_query(args)]
    config = load_config(args.config)
    queries = [q for q in config.queries if q.input_topic == args.topic]
    if not queries:
        topics = sorted({q.input_topic for q in config.queries})
        raise ValueError(f"no query of {args.config} reads --topic {args.topic!r}; give one of its input topics "
                         f"({', '.join(topics)}) or name the query whose fields to fill with --query")
    first = queries[0]
    for other in queries[1:]:
        for setting, read in _SHARED.items():
            if read(other) != read(first):
                raise ValueError(f"queries {first.name!r} and {other.name!r} both read {args.topic!r} but differ "
                                 f"in {setting} ({read(first)!r} and {read(other)!r}): one synthetic event cannot "
                                 f"fit both; name the query whose fields to fill with --query")
    return queries


def _fields(args: argparse.Namespace) -> _Fields:
    if not args.config:
        return _Fields()
    queries = _queries_filled(args)
    query = queries[0]
    values = dict.fromkeys(q.aggregations.value_field for q in queries if q.aggregations.value_field is not None)
    # A covariance's readings are centred (0, 1, 2, ...: its noise grows with their norm, as accelerometer axes
    # keep it small); a mean vector's lie far from 0 (10, 20, ...), as temperatures and humidities do, so
    # that its means are told apart from 0 by their errors.
    vector: dict[str, float] = {}
    for q in queries:
        if q.aggregations.vector is not None:
            centred = q.aggregations.vector_kind == "covariance"
            for j, name in enumerate(q.aggregations.vector.fields):
                vector.setdefault(name, float(j) if centred else 10.0 * (j + 1))
    return _Fields(
        unit=query.privacy_unit.field,
        ts=query.timestamp_field,
        group_by=tuple(query.group_by),
        values=tuple(v for v in values if v not in vector),  # a vector field gets its correlated reading
        public=query.public_group_keys() or None,
        timestamp_format=query.timestamp_format,
        partitioner=query.partitioner,
        vector=tuple(vector),
        vector_means=tuple(vector.values()),
    )


def synthetic_events(n: int, units: int, groups: int, fields: _Fields, *, seed: int, start_ms: int,
                     step_ms: float, live: bool = False) -> Iterator[tuple[bytes, bytes, int]]:
    """(key, value, event time ms) of synthetic events; skewed activity, like real users.

    ``live``: event ``i`` is due ``i * step_ms`` after the first is taken (``start_ms`` is then unused); it is
    held until then, and one taken late -- a starved process, a slow broker -- carries the time it is taken,
    not the time it was due. Dated by its schedule it would reach the broker (whose clock closes the
    windows) seconds after its window's events, late or in the next window, and a local_dp producer's one
    report per unit and window would be placed in a window the worker does not count it in.
    """
    rng = np.random.default_rng(seed)  # synthetic data only; never noise
    if live:
        start_ms = int(time.time() * 1000)
    chunk = 100_000
    for base in range(0, n, chunk):
        size = min(chunk, n - base)
        unit_ids = (rng.zipf(1.3, size) - 1) % units
        group_ids = rng.integers(0, groups, size)
        values = np.round(rng.gamma(2.0, 20.0, size), 2)
        times = start_ms + ((base + np.arange(size)) * step_ms).astype(np.int64)
        # vector fields: correlated readings around their means (field i ~ mean_i + shared + own noise)
        shared = rng.normal(0.0, 1.0, (size, 1))
        own = rng.normal(0.0, 0.5, (size, len(fields.vector)))
        vectors = np.round(np.asarray(fields.vector_means, dtype=float) + shared + own, 3)
        for i, (u, g, v, t) in enumerate(zip(unit_ids.tolist(), group_ids.tolist(), values.tolist(), times.tolist())):
            if live:
                now_ms = int(time.time() * 1000)
                if t > now_ms:
                    time.sleep((t - now_ms) / 1000)
                else:
                    t = now_ms
            unit = f"u{u}"
            # a public group is drawn whole (one value per group_by field); a made-up one repeats its name
            key = fields.public[g % len(fields.public)] if fields.public else (f"/g{g}",) * len(fields.group_by)
            event = {fields.unit: unit, fields.ts: t, **dict(zip(fields.group_by, key))}
            for name in fields.values:
                event[name] = v
            if fields.vector:
                event.update(zip(fields.vector, vectors[i].tolist()))
            yield unit.encode(), orjson.dumps(event), t


def file_events(path: Path, fields: _Fields) -> Iterator[tuple[bytes | None, bytes, int | None]]:
    """(key, value, event time ms or None) of each line; bad lines are sent as they are, for the worker to reject."""
    with path.open("rb") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                event = orjson.loads(line)
                unit, ts = event.get(fields.unit), event.get(fields.ts)
            except (orjson.JSONDecodeError, AttributeError):
                unit = ts = None
            key = None if unit is None or isinstance(unit, (dict, list)) else str(unit).encode()
            yield key, line, _event_ms(ts, fields.timestamp_format)


def _event_ms(ts: object, timestamp_format: str) -> int | None:
    if ts is None or isinstance(ts, bool) or not isinstance(ts, (int, float, str)):
        return None
    ms, problems = to_epoch_ms([ts], timestamp_format)  # type: ignore[arg-type]
    return None if problems else int(ms[0])


def run(args: argparse.Namespace) -> int:
    try:
        fields = _fields(args)
        local = local_reports(args)
    except (ConfigError, ValueError) as exc:
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
        events = synthetic_events(args.synthetic, args.units, args.groups, fields, seed=args.seed, start_ms=start,
                                  step_ms=step, live=args.rate > 0)
        total = args.synthetic
    else:
        try:  # before connecting: a missing file is the user's to fix, not a traceback after the broker's log
            args.file.open("rb").close()
        except OSError as exc:
            print(f"cannot read {args.file} ({exc.strerror}); give a JSON lines file, one event per line",
                  file=sys.stderr)
            return 1
        events = file_events(args.file, fields)
        total = None
    if local is not None:
        events = local.apply(events)
        total = None  # one report per unit per window: fewer are sent than read, so no bar to a total
    # Synthetic events at a rate are held until their time by synthetic_events itself, also when a
    # local_dp producer sends only some of them (one report per unit and window): no pacing here.
    live = args.synthetic is not None and args.rate > 0
    return _send(args.topic, events, total, args.rate, quiet=args.quiet, record_time=args.record_time,
                 partitioner=args.partitioner or fields.partitioner, live=live,
                 backfill=args.synthetic is not None and not live)  # event times spread back from now


def _prepare_topic(sender: KeyedSender, *, backfill: bool) -> None:
    """Create the topic as an input topic if it does not exist, and say what stamps its records."""
    from stream_dp.worker.kafka.input_clock import LOG_APPEND_TIME, TIMESTAMP_TYPE

    topic = sender.topic
    created, configs = sender.ensure_topic()
    if created:
        print(f"created topic {topic} with {TIMESTAMP_TYPE}={LOG_APPEND_TIME} and the broker's default partition "
              f"count: the broker stamps its records, and windows close by its clock (create it yourself beforehand "
              f"to choose its partitions)", file=sys.stderr)
    kind = configs.get(TIMESTAMP_TYPE)
    if backfill and kind == LOG_APPEND_TIME:
        print(f"{topic} has {TIMESTAMP_TYPE}={LOG_APPEND_TIME}: the broker stamps each record when it arrives, and "
              f"windows close by those stamps, so synthetic events dated back from now (no --rate) in windows that "
              f"closed before a worker read them are late; send live events with --rate, or backfill into a "
              f"CreateTime topic read with trust_producer_timestamps: true (docs/privacy/clock.md)", file=sys.stderr)


def _send(topic: str, events, total: int | None, rate: float, *, quiet: bool, record_time: str = "event",
          partitioner: str = "murmur2", live: bool = False, backfill: bool = False) -> int:
    sender = KeyedSender(Settings(), topic, partitioner)
    try:
        _prepare_topic(sender, backfill=backfill)
    except ValueError as exc:  # replication settings the cluster cannot meet, named with their fix
        print(exc, file=sys.stderr)
        return 1
    stamp_event_time = record_time == "event"
    sent = 0
    started = time.monotonic()
    last_report = -math.inf  # the first progress line at once, however long the machine has been up
    try:
        for key, value, event_ms in events:
            sender.send(key, value, event_ms if stamp_event_time else None)
            sent += 1
            if rate > 0 and not live:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            now = time.monotonic()
            if not quiet and now - last_report > 0.5:
                last_report = now
                _progress(sent, total, now - started)
        sender.flush()
    except KeyboardInterrupt:
        sender.flush()
    finally:
        sender.close()
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
