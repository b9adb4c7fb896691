"""Shared pieces of the benchmark scripts: services, synthetic events, topics,
worker processes and summaries of repeated measurements (``watch.py`` has
what observes a run: metrics, output topics, profiles).

Everything here touches only loopback services named by the environment
(``KAFKA_BOOTSTRAP_SERVERS``, ``REDIS_URL``) and only names it created itself
(prefix ``bench-``), which it deletes again.
"""

from __future__ import annotations

import datetime
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

WINDOW_MS = 60_000
SERVICES_HINT = 'start them with `bash deploy/services.sh start all && eval "$(bash deploy/services.sh env)"`'


# -- services ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Services:
    bootstrap: str
    redis_url: str

    @classmethod
    def from_env(cls) -> Services:
        return cls(
            bootstrap=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        )

    def check(self) -> None:
        """Fail early, saying how to fix it, if Kafka or Redis does not answer."""
        import redis
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
        except Exception as exc:
            raise SystemExit(f"Kafka at {self.bootstrap} does not answer ({exc}); {SERVICES_HINT}") from exc
        try:
            redis.Redis.from_url(self.redis_url, socket_timeout=5).ping()
        except Exception as exc:
            raise SystemExit(f"Redis at {self.redis_url} does not answer ({exc}); {SERVICES_HINT}") from exc


def unique_name(kind: str) -> str:
    """``bench-{kind}-{hex}``: valid as topic, group, query and namespace name."""
    return f"bench-{kind}-{uuid.uuid4().hex[:10]}"


# -- synthetic events -------------------------------------------------------------------


@dataclass
class SyntheticEvents:
    """Events as columns; ``payloads()`` renders the JSON every consumer reads (~70 bytes each)."""

    unit: np.ndarray
    group: np.ndarray
    ts_ms: np.ndarray
    value: np.ndarray
    partition: np.ndarray
    first_window_ms: int
    windows: int

    def __len__(self) -> int:
        return len(self.unit)

    def payloads(self, start: int = 0, stop: int | None = None) -> list[bytes]:
        sl = slice(start, stop)
        return [
            b'{"user_id":"u%d","ts":%d,"page":"/g%d","value":%.2f}' % row
            for row in zip(self.unit[sl].tolist(), self.ts_ms[sl].tolist(), self.group[sl].tolist(), self.value[sl].tolist())
        ]

    def keys(self, start: int = 0, stop: int | None = None) -> list[bytes]:
        return [b"u%d" % u for u in self.unit[start:stop].tolist()]


def synthetic_events(
    events: int, *, units: int, groups: int, windows: int, partitions: int, seed: int, first_window_ms: int | None = None,
    closers_after_ms: int | None = None,
) -> SyntheticEvents:
    """``events`` events of ``units`` units over ``groups`` groups, spread evenly over
    ``windows`` one-minute windows that end at least a minute before the wall clock.

    Units are uniform, so about ``units * (1 - exp(-events / windows / units))`` of
    them are active in each window; each unit's events go to the partition Kafka's default
    (murmur2) partitioner gives its key, which is where the worker checks they are.
    ``produce`` stamps each record with its event time, as a live producer would, so
    the worker's record clock (which closes windows) follows the data.

    ``closers_after_ms``: also ``PRODUCER_QUORUM`` events per partition (each of a unit of its own, group 0)
    that much after the end of the last window, appended at the end: the stream going on, whose
    record timestamps close the last window without waiting for the idle timeout (a trusted
    producer clock moves once that many units' records are stamped past a window).
    """
    from stream_dp.windows.partitioning import expected_partitions

    rng = np.random.default_rng(seed)  # synthetic data only; noise never comes from numpy
    if first_window_ms is None:
        first_window_ms = (int(time.time() * 1000) // WINDOW_MS - windows - 1) * WINDOW_MS
    unit = rng.integers(0, units, events)
    group = rng.integers(0, groups, events)
    ts_ms = first_window_ms + np.sort(rng.integers(0, windows * WINDOW_MS, events))
    value = np.round(rng.gamma(2.0, 20.0, events), 2)
    if closers_after_ms is not None:
        from stream_dp.windows.record_clock import PRODUCER_QUORUM

        closer_units = _units_on_each_partition(partitions, first=max(units, 10**9), per_partition=PRODUCER_QUORUM)
        unit = np.concatenate([unit, closer_units])
        group = np.concatenate([group, np.zeros(len(closer_units), dtype=group.dtype)])
        end_ms = first_window_ms + windows * WINDOW_MS + closers_after_ms
        ts_ms = np.concatenate([ts_ms, np.full(len(closer_units), end_ms, dtype=ts_ms.dtype)])
        value = np.concatenate([value, np.zeros(len(closer_units))])
    return SyntheticEvents(
        unit=unit,
        group=group,
        ts_ms=ts_ms,
        value=value,
        partition=expected_partitions(_unit_keys(unit), partitions, "murmur2"),
        first_window_ms=first_window_ms,
        windows=windows,
    )


def _unit_keys(unit: np.ndarray) -> np.ndarray:
    return np.char.add(b"u", unit.astype("S20"))


def _units_on_each_partition(partitions: int, first: int, per_partition: int = 1) -> np.ndarray:
    """``per_partition`` unit numbers per partition (partition by partition), from ``first`` on, whose keys
    murmur2 puts on that partition."""
    from stream_dp.windows.partitioning import expected_partitions

    candidates = np.arange(first, first + 64 * partitions * per_partition)
    placed = expected_partitions(_unit_keys(candidates), partitions, "murmur2")
    return np.concatenate([candidates[np.flatnonzero(placed == p)[:per_partition]] for p in range(partitions)])


def group_names(groups: int) -> list[str]:
    return [f"/g{g}" for g in range(groups)]


# -- Kafka topics -----------------------------------------------------------------------


def admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def create_topic(bootstrap: str, name: str, partitions: int, *, retention_ms: int | None = None) -> None:
    """An input topic whose producers stamp its records (CreateTime): the benchmarks backfill past windows with
    records stamped with their event times, read by queries that trust them (``worker_config``).
    ``retention_ms``: the broker deletes what is older, in 256 MB segments (a live soak's topic, read as it is
    written, would otherwise fill the disk: an hour at 200k events/s is about 50 GB)."""
    from confluent_kafka.admin import NewTopic

    config = {"message.timestamp.type": "CreateTime"}
    if retention_ms is not None:
        config |= {"retention.ms": str(retention_ms), "segment.bytes": str(256 * 2**20)}
    client = admin(bootstrap)  # kept referenced until the futures resolve
    futures = client.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])
    futures[name].result(timeout=30)


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete every topic whose name starts with ``prefix``; returns their names."""
    client = admin(bootstrap)
    names = [t for t in client.list_topics(timeout=10).topics if t.startswith(prefix)]
    if names:
        for future in client.delete_topics(names, operation_timeout=30).values():
            try:
                future.result(timeout=30)
            except Exception as exc:  # already gone: nothing to clean
                print(f"  (topic cleanup: {exc})", file=sys.stderr)
    return names


def delete_groups(bootstrap: str, groups: Iterable[str]) -> None:
    groups = list(groups)
    if not groups:
        return
    client = admin(bootstrap)
    for future in client.delete_consumer_groups(groups, request_timeout=15).values():
        try:
            future.result(timeout=20)
        except Exception:  # never joined or already gone
            pass


def produce(bootstrap: str, topic: str, events: SyntheticEvents, *, chunk: int = 200_000) -> float:
    """Publish ``events`` (keyed by unit, to their partition, the record stamped with the event
    time); returns the seconds it took."""
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1_000_000,
        "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1_048_576, "log_level": 3,
    })
    started = time.perf_counter()
    for base in range(0, len(events), chunk):
        stop = min(base + chunk, len(events))
        rows = zip(events.keys(base, stop), events.payloads(base, stop), events.partition[base:stop].tolist(),
                   events.ts_ms[base:stop].tolist())
        for key, value, part, ts in rows:
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=part, timestamp=ts)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} events to {topic} were not acknowledged within 120 s")
    return time.perf_counter() - started


# -- worker processes -------------------------------------------------------------------


def worker_config(
    name: str, input_topic: str, *, groups: int, window: str = "1m", allowed_lateness: str = "5s",
    idle_timeout: str = "10s", epsilon_limit: float = 1000.0, publish_from_ms: int | None = None,
) -> dict[str, Any]:
    """A query like the example one, with public groups ``/g0`` .. and limits high enough
    that no unit runs out of budget (so none is excluded). ``publish_from_ms``: the first window of
    events produced before the worker's first start (a backlog), which it publishes from then."""
    window_settings = {"size": window, "allowed_lateness": allowed_lateness, "idle_timeout": idle_timeout}
    if publish_from_ms is not None:
        window_settings["publish_from"] = datetime.datetime.fromtimestamp(
            publish_from_ms / 1000, datetime.timezone.utc).isoformat()
    return {
        "namespaces": {name: {"budgets": [{"horizon": "1h", "epsilon": epsilon_limit},
                                          {"horizon": "24h", "epsilon": 4 * epsilon_limit}],
                              "alert_at": [1.0]}},
        "queries": [{
            "name": name,
            "input_topic": input_topic,
            "output_topic": f"{name}-out",
            "privacy_unit": {"namespace": name, "field": "user_id"},
            "timestamp_field": "ts",
            "timestamp_format": "epoch_ms",
            "window": window_settings,
            "group_by": ["page"],
            "groups": {"public": group_names(groups)},
            "bounds": {"max_groups_per_unit": 3, "max_events_per_group": 2},
            "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 100]}, "mean": {"field": "value"}},
            "mechanism": "laplace",
            "epsilon": 0.1,
            "release_timeout": "2m",
            "trust_producer_timestamps": True,  # see ``create_topic``
        }],
    }


class WorkerProcess:
    """``stream-dp run`` as a subprocess with its own metrics port; stopped with SIGTERM.

    ``processes``: ``stream-dp run --processes N`` (N workers under one supervisor, one
    metrics endpoint). Logs at INFO: the worker logs a few lines only, among them when its
    partitions are assigned, where end-to-end clocks start."""

    def __init__(self, config_path: Path, *, services: Services, group_id: str, internal_prefix: str,
                 metrics_port: int, log_path: Path, secret: str = "bench-secret-0123456789abcdef",
                 pythonpath: Path | None = None, processes: int = 1, log_level: str = "INFO") -> None:
        env = dict(
            os.environ, KAFKA_BOOTSTRAP_SERVERS=services.bootstrap, REDIS_URL=services.redis_url,
            STREAM_DP_GROUP_ID=group_id, STREAM_DP_INTERNAL_TOPIC_PREFIX=internal_prefix,
            STREAM_DP_METRICS_PORT=str(metrics_port), STREAM_DP_CONTRIBUTION_SECRET=secret,
        )
        if pythonpath is not None:  # another copy of stream_dp, for an A/B comparison of a change
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
        self.port = metrics_port
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path), "--log-level", log_level,
             "--processes", str(processes)],
            env=env, stdout=subprocess.DEVNULL, stderr=self._log,
            cwd=log_path.parent,  # not the repository: ``python -m`` would import its stream_dp before ``pythonpath``'s
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return self.process.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, default_flow_style=None, width=1_000_000))
    return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cleanup_redis(redis_url: str, namespace: str, query: str) -> int:
    """Delete the budget states, charge records and release ledger entries of one benchmark run
    (query and namespace names are unique per run, so the patterns match nothing else)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        for pattern in (f"dp:?:{namespace}:*", f"dp:m:{namespace}", f"stream-dp:*{query}*"):
            batch = list(client.scan_iter(match=pattern, count=5_000))
            for i in range(0, len(batch), 5_000):
                deleted += client.delete(*batch[i : i + 5_000])
    finally:
        client.close()
    return deleted


# -- summaries --------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median of the repetitions and their spread ((max - min) / median)."""
    finite = [v for v in values if v == v]
    if not finite:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "spread": float("nan"), "runs": list(values)}
    median = statistics.median(finite)
    return {
        "median": median,
        "min": min(finite),
        "max": max(finite),
        "spread": (max(finite) - min(finite)) / median if median else float("nan"),
        "runs": list(values),
    }
