"""The synthetic stream of a fault run: a seeded schedule of live events, its query file, its producer.

Events carry the wall-clock time they are scheduled for (less a little
jitter, well inside the allowed lateness), so windows close as they would on
a live stream. Some units are heavy (more pages and events than the bounds
allow) and some values fall outside the clip range, so bounding and clipping
are exercised; a few events are sent after everything else with times in the
first window, once the broker acknowledged everything else and two seconds
later, so they are late for certain.

Before the stream, ``LiveProducer.warm_up`` sends every input partition a
record that is not an event (dead-lettered as malformed) twice a second,
from before the workers start until the stream has run two seconds: every
partition then has a record clock from the start and is never idle while
the stream runs. Otherwise a partition with no record yet is idle from its
assignment, other partitions' clocks close its windows, and on a starved
machine its first events, delivered a second after the others', are late
by the worker's clock and on time by the model's (which knows no wall
clock).

Two queries read the stream: ``*_free`` draws on a budget no unit can use up
(so a unit's spend counts exactly the windows it was charged for) and
``*_capped`` on a budget of three windows (so exclusion happens). With
``StreamSpec.gaussian`` a third, ``*_gauss``, adds Gaussian noise on a
namespace of two horizons, a day's epsilon limit of five windows and an
hour's delta limit of three: its units are excluded once their delta runs out;
with ``selected`` ``*_select`` releases the groups partition selection picks;
with ``top_k`` ``*_top`` releases counts and a top-2 record, on a budget of
three windows; with ``continual`` ``*_cont`` releases running totals over
periods of ``CONTINUAL_WINDOWS`` windows, a unit counted in at most
``CONTINUAL_MAX_WINDOWS`` windows of a period and charged once per period,
on a budget of two periods (units are left out from their third period on).
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import yaml

PAGES = ("home", "search", "cart")
EPSILON = 2.0
CAPPED_WINDOWS = 3
MAX_GROUPS = 2
MAX_EVENTS = 3
CLIP = (0.0, 10.0)
GAUSS_DELTA = 1e-7
SELECT_DELTA = 1e-6  # partition selection's delta per window
GAUSS_DELTA_WINDOWS = 3  # the hour's delta limit binds first: at the fourth window
GAUSS_EPSILON_WINDOWS = 5  # the day's epsilon limit
CONTINUAL_WINDOWS = 5  # windows per period of the continual query
CONTINUAL_MAX_WINDOWS = 2  # in how many windows of a period a unit counts
CONTINUAL_PERIODS = 2  # periods its budget holds


@dataclass(frozen=True)
class StreamSpec:
    """What to send: ``rate_per_s`` events a second for ``duration_s`` over ``units`` units."""

    seed: int
    units: int = 150
    partitions: int = 3
    window_ms: int = 2_000
    lateness_ms: int = 1_000
    idle_ms: int = 2_000
    duration_s: float = 14.0
    rate_per_s: float = 250.0
    late_events: int = 4
    warm_overlap_s: float = 2.0  # the warm-up goes on this long after the stream began
    jitter_ms: int = 300
    gaussian: bool = False  # a third query: Gaussian noise, (epsilon, delta) charged on two horizons
    selected: bool = False  # and one whose groups partition selection picks (its delta charged per window)
    top_k: bool = False  # and one releasing its counts and a top-2 record per window
    continual: bool = False  # and one releasing running totals per period (continual release)

    def __post_init__(self) -> None:
        if self.jitter_ms >= self.lateness_ms:
            raise ValueError("jitter_ms must stay below lateness_ms, or on-time events could be late")


@dataclass(frozen=True)
class ScheduledEvent:
    at_s: float  # seconds after the stream starts
    partition: int
    unit: str
    page: str
    value: float
    ts_offset_ms: int  # event time = stream start + this


def unit_partition(unit: str, partitions: int) -> int:
    """The partition librdkafka's default (CRC32) partitioner gives ``unit``'s key."""
    return zlib.crc32(unit.encode()) % partitions


def schedule(spec: StreamSpec) -> list[ScheduledEvent]:
    """The seeded event list, in sending order (numpy's generator: synthetic data only)."""
    rng = np.random.default_rng(spec.seed)
    units = [f"user-{spec.seed:x}-{i:04x}" for i in range(spec.units)]
    weights = 1.0 / np.arange(1, spec.units + 1) ** 0.8  # a few heavy units exceed the bounds
    weights /= weights.sum()
    n = int(spec.rate_per_s * spec.duration_s)
    at = np.sort(rng.uniform(0.0, spec.duration_s, n))
    who = rng.choice(spec.units, size=n, p=weights)
    pages = rng.integers(0, len(PAGES), n)
    values = rng.integers(-2, 14, n).astype(float)  # some below and above the clip range
    jitter = rng.integers(0, spec.jitter_ms, n)
    events = [
        ScheduledEvent(float(a), unit_partition(units[u], spec.partitions), units[u], PAGES[p], float(v),
                       int(a * 1000) - int(j))
        for a, u, p, v, j in zip(at.tolist(), who.tolist(), pages.tolist(), values.tolist(), jitter.tolist())
    ]
    for k in range(spec.late_events):
        unit = units[int(rng.integers(0, spec.units))]
        events.append(ScheduledEvent(spec.duration_s + 0.5, unit_partition(unit, spec.partitions), unit,
                                     PAGES[k % len(PAGES)], 1.0, 10 + k))
    return events


#: What the warm-up sends: not JSON, so dead-lettered as malformed; it counts for activity and moves the clock.
WARM_UP_RECORD = b"warm-up: not an event"


def encode_event(event: ScheduledEvent, start_ms: int) -> bytes:
    return orjson.dumps({"user_id": event.unit, "ts": start_ms + event.ts_offset_ms, "page": event.page,
                         "value": event.value})


def write_config(path: Path, name: str, input_topic: str, spec: StreamSpec) -> dict[str, str]:
    """The query file; returns query name -> output topic."""
    window = {"size": f"{spec.window_ms}ms", "allowed_lateness": f"{spec.lateness_ms}ms",
              "idle_timeout": f"{spec.idle_ms}ms"}
    namespaces = {
        f"{name}-free": {"budgets": [{"horizon": "1h", "epsilon": 1000.0}], "alert_at": [1.0]},
        f"{name}-capped": {"budgets": [{"horizon": "1h", "epsilon": EPSILON * CAPPED_WINDOWS}], "alert_at": [1.0]},
    }
    outputs = {f"{name}_free": f"{name}-out-free", f"{name}_capped": f"{name}-out-capped"}
    if spec.gaussian:
        namespaces[f"{name}-gauss"] = {"budgets": [
            {"horizon": "1h", "epsilon": 1000.0, "delta": GAUSS_DELTA * GAUSS_DELTA_WINDOWS},
            {"horizon": "1d", "epsilon": EPSILON * GAUSS_EPSILON_WINDOWS}], "alert_at": [1.0]}
        outputs[f"{name}_gauss"] = f"{name}-out-gauss"
    if spec.selected:
        namespaces[f"{name}-select"] = {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}],
                                        "alert_at": [1.0]}
        outputs[f"{name}_select"] = f"{name}-out-select"
    if spec.top_k:
        namespaces[f"{name}-top"] = {"budgets": [{"horizon": "1h", "epsilon": EPSILON * CAPPED_WINDOWS}],
                                     "alert_at": [1.0]}
        outputs[f"{name}_top"] = f"{name}-out-top"
    if spec.continual:
        namespaces[f"{name}-cont"] = {"budgets": [{"horizon": "1h", "epsilon": EPSILON * CONTINUAL_PERIODS}],
                                      "alert_at": [1.0]}
        outputs[f"{name}_cont"] = f"{name}-out-cont"
    queries = []
    for query, output in outputs.items():
        gauss = {"mechanism": "gaussian", "delta": GAUSS_DELTA} if query.endswith("_gauss") else {}
        groups = {"select": {"delta": SELECT_DELTA}} if query.endswith("_select") else {"public": list(PAGES)}
        queries.append({
            "name": query,
            "input_topic": input_topic,
            "output_topic": output,
            "privacy_unit": {"namespace": f"{name}-{query.rsplit('_', 1)[1]}", "field": "user_id"},
            "timestamp_field": "ts",
            "window": window,
            "group_by": ["page"],
            "groups": groups,
            "bounds": {"max_groups_per_unit": MAX_GROUPS, "max_events_per_group": MAX_EVENTS},
            "aggregations": {"count": {}, "top_k": {"k": 2}} if query.endswith("_top") else {
                "count": {}, "sum": {"field": "value", "clip": list(CLIP)}, "mean": {"field": "value"}},
            "epsilon": EPSILON,
            "release_timeout": "120s",
            # unit_partition places keys as librdkafka's default partitioner does
            "partitioner": "crc32",
            **gauss,
            **({"continual": {"period": f"{spec.window_ms * CONTINUAL_WINDOWS}ms",
                              "max_windows_per_unit": CONTINUAL_MAX_WINDOWS}} if query.endswith("_cont") else {}),
        })
    path.write_text(yaml.safe_dump({"namespaces": namespaces, "queries": queries}, sort_keys=False))
    return outputs


@dataclass
class LiveProducer:
    """Sends a schedule in real time from a thread; counts what the broker acknowledged."""

    bootstrap: str
    topic: str
    events: list[ScheduledEvent]
    client_options: dict = field(default_factory=dict)
    #: Events scheduled after this (the ones late on purpose) wait until the broker acknowledged every earlier
    #: one, then ``late_gap_s`` more: so they never share a broker batch, nor likely a worker's read, with a
    #: backlog producers buffered through a broker outage, which a worker judges by the clock from before it
    #: (and may then accept even these).
    late_after_s: float | None = None
    late_gap_s: float = 2.0
    start_ms: int = 0
    acknowledged: int = 0
    failed: int = 0
    error: str | None = None  # why the producer gave up, if it did
    done: threading.Event = field(default_factory=threading.Event)
    warm_ups: int = 0  # warm-up records the broker acknowledged
    _thread: threading.Thread | None = None
    _warm_thread: threading.Thread | None = None
    _stream_started: float | None = None  # time.monotonic() when the stream began

    def warm_up(self, partitions: int, overlap_s: float, every_s: float = 0.5) -> None:
        """Send each of ``partitions`` a ``WARM_UP_RECORD`` every ``every_s`` from now until ``overlap_s``
        after ``start`` (module docstring)."""
        self._warm_thread = threading.Thread(target=self._warm, args=(partitions, overlap_s, every_s),
                                             name="warm-up", daemon=True)
        self._warm_thread.start()

    def _warm(self, partitions: int, overlap_s: float, every_s: float) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0,
                             "reconnect.backoff.max.ms": 250, "message.timeout.ms": 120_000,
                             **self.client_options})

        def delivered(err, _message) -> None:
            if err is None:
                self.warm_ups += 1

        try:
            while self._stream_started is None or time.monotonic() - self._stream_started < overlap_s:
                for partition in range(partitions):
                    producer.produce(self.topic, value=WARM_UP_RECORD, partition=partition, on_delivery=delivered)
                next_at = time.monotonic() + every_s
                while (left := next_at - time.monotonic()) > 0:
                    producer.poll(left)  # returns early once it served a delivery report
        except Exception as exc:  # reported by the harness; a thread must not die with an unhandled error
            self.error = f"warm-up: {type(exc).__name__}: {exc}"
        finally:
            producer.flush(150)

    def start(self) -> None:
        self._stream_started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="live-producer", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in (self._thread, self._warm_thread):
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

    def _on_delivery(self, err, _message) -> None:
        if err is None:
            self.acknowledged += 1
        else:
            self.failed += 1

    def _run(self) -> None:
        try:
            self._send_all()
        except Exception as exc:  # reported by the harness; a thread must not die with an unhandled error
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def _send_all(self) -> None:
        # librdkafka, not kafka-python: it rides out a stopped broker without Python sockets
        # (kafka-python 3.0 leaks one per refused connect), as most production producers do.
        from confluent_kafka import Producer

        # The worker's idle rule holds a partition open for `idle_timeout` after the broker answers
        # again; a producer must deliver what it buffered within that time (README), so its
        # reconnect backoff stays well under the workloads' 2 s idle_timeout.
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 5,
                             "enable.idempotence": True, "message.timeout.ms": 120_000,
                             "reconnect.backoff.max.ms": 250, **self.client_options})
        started = time.monotonic()
        self.start_ms = int(time.time() * 1000)
        held_back = False
        for event in self.events:
            late = self.late_after_s is not None and event.at_s > self.late_after_s
            if late and not held_back:
                held_back = True
                left = producer.flush(150)
                if left:
                    raise RuntimeError(f"{left} events still unacknowledged after 150 s")
                time.sleep(self.late_gap_s)
            delay = 0.0 if late else started + event.at_s - time.monotonic()
            while delay > 0:
                producer.poll(min(delay, 0.05))  # serve delivery callbacks while waiting
                delay = started + event.at_s - time.monotonic()
            while True:
                try:
                    producer.produce(self.topic, key=event.unit.encode(), value=encode_event(event, self.start_ms),
                                     partition=event.partition, on_delivery=self._on_delivery)
                    break
                except BufferError:  # the local queue is full while the broker is away: wait for it
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(150)
        if left:
            raise RuntimeError(f"{left} events still unacknowledged after 150 s")
