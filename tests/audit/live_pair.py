"""Two neighbouring live streams, D and D' (D plus a target), each through its own real worker process.

For publication tests: which (window, kind, group) a query publishes must be the same with and without
one unit, whatever that unit sends. Events are sent live, window by window, each dated and stamped
with the wall clock at its window, to a one-partition input topic per stream whose records the broker
stamps (LogAppendTime), as input topics are to be created: the windows close on the broker's clock. Each stream has its
own consumer group, internal topics, budget namespace and output topic, so the two never meet.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from tests.audit.neighbours import _OutputReader
from tests.reliability.topics import _kafka, create_topic, delete_topics
from tests.reliability.workers import WorkerProcess

SECRET = "publication-secret-0123456789abcdef"
#: (unit id, milliseconds into the window, event fields besides the unit and the time)
Event = tuple[str, int, dict]


def release_key(record: dict) -> tuple[int, str, str]:
    """(window start, kind, group) of a release record: what a subscriber sees published."""
    group = record.get("group")
    return (record["window"]["start_ms"], record.get("kind", "group"),
            orjson.dumps(group, option=orjson.OPT_SORT_KEYS).decode() if group is not None else "")


@dataclass
class Stream:
    label: str
    work_dir: Path
    bootstrap: str
    redis_url: str
    query: dict  # one query, without its topics and namespace
    run: str = field(default_factory=lambda: f"pub{uuid.uuid4().hex[:8]}")
    worker: WorkerProcess | None = None
    records: list[dict] = field(default_factory=list)

    @property
    def topic(self) -> str:
        return f"{self.run}-in"

    @property
    def output(self) -> str:
        return f"{self.run}-out"

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        create_topic(self.bootstrap, self.topic, 1, {"message.timestamp.type": "LogAppendTime"})  # as users are told
        config = {
            "namespaces": {self.run: {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]}},
            "queries": [{**self.query, "name": self.run.replace("-", "_"), "input_topic": self.topic,
                         "output_topic": self.output,
                         "privacy_unit": {"namespace": self.run, "field": "user_id"}}],
        }
        path = self.work_dir / "queries.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))}
        env.update(KAFKA_BOOTSTRAP_SERVERS=self.bootstrap, REDIS_URL=self.redis_url,
                   STREAM_DP_GROUP_ID=f"{self.run}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{self.run}.",
                   STREAM_DP_CONTRIBUTION_SECRET=SECRET, STREAM_DP_OUTPUT_PARTITIONS="1",
                   STREAM_DP_CONSUMER_SESSION_TIMEOUT_MS="45000")
        self.worker = WorkerProcess(f"{self.label}-worker", path, env, self.work_dir)
        self.worker.start()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the worker owns its input partition and its release homes."""
        assert self.worker is not None
        for needle in ("stream_dp.worker.ingest.stage: assigned", "release homes assigned ["):
            if not self.worker.wait_for_log(needle, timeout_s):
                raise RuntimeError(f"{self.label}: the worker did not log {needle!r}:\n{self.worker.log_text()[-3000:]}")

    def check(self) -> None:
        assert self.worker is not None
        code = self.worker.reap()
        if code is not None:
            raise RuntimeError(f"{self.label}: the worker exited with {code}:\n{self.worker.log_text()[-3000:]}")

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        delete_topics(self.bootstrap, [self.topic, self.output])

    def log_tail(self) -> str:
        return "" if self.worker is None else f"--- {self.label}\n{self.worker.log_text()[-4000:]}"


class LivePair:
    """D and D' of one query; ``produce`` sends both streams' events window by window, live."""

    def __init__(self, work_dir: Path, bootstrap: str, redis_url: str, query: dict) -> None:
        self.streams = {label: Stream(label, work_dir / label, bootstrap, redis_url, query)
                        for label in ("D", "D'")}
        self.bootstrap = bootstrap
        self.window_ms = 0
        self.data_windows: list[int] = []

    def __enter__(self) -> LivePair:
        try:
            for stream in self.streams.values():
                stream.start()
            for stream in self.streams.values():
                stream.wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for stream in self.streams.values():
            stream.stop()

    def produce(self, windows: int, window_ms: int, events: Callable[[int, bool], list[Event]]) -> None:
        """``events(w, with_target)``: the events of the ``w``-th window; each window's are sent just after it
        opens (by the wall clock), dated and stamped at their place in it."""
        kafka = _kafka()
        producer = kafka.KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        self.window_ms = window_ms
        first = (int(time.time() * 1000) // window_ms + 2) * window_ms
        try:
            for w in range(windows):
                start = first + w * window_ms
                time.sleep(max(0.0, (start + 20) / 1000 - time.time()))
                for label, stream in self.streams.items():
                    for unit, at, fields in events(w, label == "D'"):
                        ts = start + at
                        value = orjson.dumps({"user_id": unit, "ts": ts, **fields})
                        producer.send(stream.topic, key=unit.encode(), value=value, timestamp_ms=ts)
                producer.flush(timeout=30)
                self.data_windows.append(start)
        finally:
            producer.close()

    def collect(self, timeout_s: float = 90.0, after_windows: int = 3) -> None:
        """Read both output topics until each stream has published a window ``after_windows`` past the last
        data window (public groups publish every window, empty ones too), or ``timeout_s`` passes."""
        beyond = self.data_windows[-1] + after_windows * self.window_ms
        deadline = time.monotonic() + timeout_s
        readers = {label: _OutputReader(self.bootstrap, [s.output]) for label, s in self.streams.items()}
        try:
            while time.monotonic() < deadline:
                for label, reader in readers.items():
                    self.streams[label].records.extend(orjson.loads(v) for _, v in reader.poll(0.3))
                    self.streams[label].check()
                if all(any(r["window"]["start_ms"] >= beyond for r in s.records) for s in self.streams.values()):
                    return
        finally:
            for reader in readers.values():
                reader.close()

    def published(self, label: str) -> set[tuple[int, str, str]]:
        """(window, kind, group) published by one stream for the windows that held data."""
        lo, hi = self.data_windows[0], self.data_windows[-1]
        return {release_key(r) for r in self.streams[label].records if lo <= r["window"]["start_ms"] <= hi}

    def log_tails(self) -> str:
        return "\n".join(s.log_tail() for s in self.streams.values())
