"""A one-query, one-worker pipeline for replaying one fault step by step.

Event times are fixed points in the recent past (window ``k`` starts
``base_ms + k * WINDOW_MS``), and the idle timeout is long, so a window
closes exactly when an event ``LATENESS_MS`` past its end is processed:
the tests decide what closes when by what they send.
"""

from __future__ import annotations

import datetime
import os
import time
import uuid
from collections import defaultdict
from pathlib import Path

import orjson
import yaml

from stream_dp.windows.record_clock import PRODUCER_QUORUM
from stream_dp.worker.partials.wire import PartialAggregate
from stream_dp.worker.release.intake import PartialsReader
from tests.reliability.redis_proxy import FaultProxy
from tests.reliability.services import PrivateRedis
from tests.reliability.topics import TopicRecord, create_topic, delete_topics, read_topic, wait_until
from tests.reliability.workers import WorkerProcess, metric_total

WINDOW_MS = 2_000
LATENESS_MS = 500
EPSILON = 1.0
SECRET = "scenario-secret-0123456789abcdef"
PAGES = ("home", "search")
TICK = b"clock tick"  # how a record that carries only its record timestamp starts (``Scenario.closers``)


class Scenario:
    """``budget_windows``: how many windows a unit's budget covers (None: practically unlimited)."""

    def __init__(self, work_dir: Path, bootstrap: str, *, partitions: int = 1, partials_partitions: int = 1,
                 budget_windows: int | None = None, redis_server: PrivateRedis | None = None,
                 redis_credentials: str = "", worker_env: dict[str, str] | None = None) -> None:
        """``redis_credentials``: ``user:password@`` for the worker's Redis URL; ``worker_env`` overrides
        the worker's environment (e.g. Kafka security settings)."""
        self.work_dir = work_dir
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.name = f"sc-{uuid.uuid4().hex[:10]}"
        self.query = self.name.replace("-", "_")
        self.input_topic = f"{self.name}-in"
        self.output_topic = f"{self.name}-out"
        self.prefix = f"{self.name}."
        self.base_ms = (int(time.time() * 1000) - 120_000) // WINDOW_MS * WINDOW_MS
        self.redis = redis_server or PrivateRedis(work_dir / "redis")
        if not self.redis.running:
            self.redis.start()
        self.proxy = FaultProxy(self.redis.port)
        create_topic(bootstrap, self.input_topic, partitions, {"message.timestamp.type": "CreateTime"})
        limit = EPSILON * budget_windows if budget_windows is not None else 1000.0
        config = {
            "namespaces": {f"{self.name}-units": {"budgets": [{"horizon": "1h", "epsilon": limit}], "alert_at": [1.0]}},
            "queries": [{
                "name": self.query, "input_topic": self.input_topic, "output_topic": self.output_topic,
                "privacy_unit": {"namespace": f"{self.name}-units", "field": "user_id"},
                "timestamp_field": "ts",
                # windows from base_ms on, older than the worker: published because the file says so
                "window": {"size": f"{WINDOW_MS}ms", "allowed_lateness": f"{LATENESS_MS}ms", "idle_timeout": "10m",
                           "publish_from": datetime.datetime.fromtimestamp(
                               self.base_ms / 1000, datetime.timezone.utc).isoformat()},
                "group_by": ["page"], "groups": {"public": list(PAGES)},
                "bounds": {"max_groups_per_unit": 2, "max_events_per_group": 5},
                "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 10]}},
                "epsilon": EPSILON, "release_timeout": "10m",
                # a backfill of windows minutes old: ``produce`` stamps records with their events' times
                "trust_producer_timestamps": True,
            }],
        }
        self.config_path = work_dir / "queries.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))}
        env.update(KAFKA_BOOTSTRAP_SERVERS=bootstrap, STREAM_DP_GROUP_ID=f"{self.name}-g",
                   STREAM_DP_INTERNAL_TOPIC_PREFIX=self.prefix, STREAM_DP_CONTRIBUTION_SECRET=SECRET,
                   STREAM_DP_PARTIALS_PARTITIONS=str(partials_partitions), STREAM_DP_OUTPUT_PARTITIONS="1",
                   REDIS_URL=self.proxy.url(redis_credentials), STREAM_DP_REDIS_TIMEOUT_S="1")
        env.update(worker_env or {})
        self.worker = WorkerProcess("worker", self.config_path, env, work_dir)
        self._producer = None
        self._last_stamp: int | None = None

    # -- time -----------------------------------------------------------------------

    def window_start(self, k: int) -> int:
        return self.base_ms + k * WINDOW_MS

    def event(self, unit: str, k: int, *, page: str = "home", value: float = 1.0, at_ms: int = 100) -> bytes:
        return orjson.dumps({"user_id": unit, "ts": self.window_start(k) + at_ms, "page": page, "value": value})

    def closer(self, k: int, unit: str = "closer") -> bytes:
        """An event whose record stamp is past every window up to ``k`` (it lies in window ``k + 1``)."""
        return self.event(unit, k + 1, at_ms=LATENESS_MS)

    def closers(self, k: int, unit: str = "closer") -> list[bytes]:
        """What closes every window up to ``k``: closers of ``PRODUCER_QUORUM`` units (``unit`` and numbered
        others), events in window ``k + 1``. A trusted producer clock moves only once that many units' events
        are stamped past a window (``record_clock``); records of no unit count for none."""
        return [self.closer(k, unit)] + [self.closer(k, f"{unit}-{i}") for i in range(1, PRODUCER_QUORUM)]

    # -- I/O ------------------------------------------------------------------------

    def produce(self, values: list[bytes], partition: int = 0, timestamps: list[int] | None = None) -> list[int]:
        """Send and wait for the broker; returns the offsets.

        Like a backfill producer: each record is keyed by its unit id and stamped
        with its event time (a message without a plausible one gets the stamp
        before it), unless ``timestamps`` gives the record timestamps.
        """
        from tests.reliability.topics import _kafka

        if self._producer is None:
            self._producer = _kafka().KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        futures = []
        now_ms = int(time.time() * 1000)
        for i, value in enumerate(values):
            key, stamp = _key_and_time(value)
            if timestamps is not None:
                self._last_stamp = timestamps[i]
            elif stamp is not None and self.base_ms <= stamp <= now_ms:
                # a hostile time (far past or future) does not become the record's: that producer is trusted
                self._last_stamp = stamp
            futures.append(self._producer.send(self.input_topic, key=key, value=value, partition=partition,
                                               timestamp_ms=self._last_stamp))
        self._producer.flush()
        return [f.get(timeout=30).offset for f in futures]

    def close_producer(self) -> None:
        """Close the harness's producer (before a broker stops: kafka-python leaks a socket on every
        reconnect it tries meanwhile); ``produce`` opens a new one."""
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None

    def start_worker(self, timeout_s: float = 60.0) -> None:
        """Start the worker and wait until it owns the input partitions."""
        before = self.worker.log_size()
        self.worker.start()
        if not self.worker.wait_for_log(f"{self.input_topic}[", timeout_s, after=before):
            raise RuntimeError(f"the worker did not get {self.input_topic} assigned; see {self.worker.log_path}")

    def partials(self) -> dict[int, list[PartialAggregate]]:
        """Window start -> every partial published for it (all partitions, all copies)."""
        out: dict[int, list[PartialAggregate]] = defaultdict(list)
        reader = PartialsReader()
        for record in read_topic(self.bootstrap, f"{self.prefix}partials"):
            message = reader.read(record.partition, record.offset, record.value)
            if isinstance(message, PartialAggregate):
                out[message.window_start_ms].append(message)
        return out

    def releases(self) -> dict[int, list[dict]]:
        out: dict[int, list[dict]] = defaultdict(list)
        for record in read_topic(self.bootstrap, self.output_topic):
            value = orjson.loads(record.value)
            out[value["window"]["start_ms"]].append(value)
        return out

    def dead_letters(self) -> list[TopicRecord]:
        return read_topic(self.bootstrap, f"{self.prefix}dead-letter")

    def metric(self, name: str, **labels: str) -> float:
        text = self.worker.scrape()
        return 0.0 if text is None else metric_total(text, name, **labels)

    def wait_released(self, k: int, timeout_s: float) -> bool:
        return wait_until(lambda: self.window_start(k) in self.releases(), timeout_s, 1.0)

    def close(self) -> None:
        self.worker.kill()
        self.proxy.close()
        self.redis.stop()
        self.close_producer()
        delete_topics(self.bootstrap, [self.input_topic, self.output_topic, f"{self.prefix}partials",
                                       f"{self.prefix}alerts", f"{self.prefix}dead-letter"])


def _key_and_time(value: bytes | None) -> tuple[bytes | None, int | None]:
    """The unit id (as the message key) and the event time in ms of an event, where it has them; a tick is
    keyed by itself."""
    try:
        event = orjson.loads(value)  # type: ignore[arg-type]
        unit, ts = event.get("user_id"), event.get("ts")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return (value if isinstance(value, bytes) and value.startswith(TICK) else None), None
    key = str(unit).encode() if isinstance(unit, (str, int)) and not isinstance(unit, bool) else None
    stamp = int(ts) if isinstance(ts, int) and not isinstance(ts, bool) and 0 <= ts < 2**53 else None
    return key, stamp
