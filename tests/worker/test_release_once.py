"""A window is released at most once, forever: a release group reset to the
start of the partials topic never releases a window a second time.

One in-process worker releases two data windows (a backfill stamped ten
minutes ago, 60 units on two input partitions). Then the release consumer
group loses its offsets (deleted, as the broker's offsets retention does to
an idle group) and a second worker replays the whole partials topic:

* more than the ledger TTL later (its clock is ahead; the ledger keys that
  have a TTL are deleted, as expiry would), every old partial is dropped
  and counted, and no window of the first run is released again;
* within the TTL, with the ledger's entries marked unpublished (a crash
  between the ledger write and the publish), the stored records are
  published again, byte for byte: no noise is drawn twice.

Both for public groups (where empty windows are released too) and for
groups chosen by partition selection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import redis
import yaml
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from stream_dp.config import Settings, load_config
from stream_dp.worker.app import Worker
from stream_dp.worker.ledger import RedisReleaseLedger
from tests.reliability.topics import read_topic

pytestmark = [pytest.mark.services, pytest.mark.slow]

MIN = 60_000
UNITS = 60
DATA_WINDOWS = 2
LEDGER_TTL_S = 8_200  # about the shortest allowed (input retention of an hour): a small clock jump
GROUPS = {"public": {"public": ["a", "b"]}, "selected": {"select": {"delta": 1e-5}}}


def _config(path: Path, name: str, input_topic: str, output_topic: str, groups: str) -> Path:
    path.write_text(yaml.safe_dump({
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 100.0, "delta": 1e-3}]}},
        "queries": [{
            "name": name, "input_topic": input_topic, "output_topic": output_topic,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"},
            "timestamp_field": "ts",
            "window": {"size": "1m", "allowed_lateness": "1s", "idle_timeout": "2s"},
            "group_by": ["page"], "groups": GROUPS[groups],
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}},
            "epsilon": 1.0, "release_timeout": "20s",
        }],
    }))
    return path


class _Deployment:
    """One query's topics, settings and ledger, and the in-process workers run against them."""

    def __init__(self, tmp_path: Path, bootstrap: str, redis_url: str, name: str, input_topic: str, groups: str):
        self.bootstrap = bootstrap
        self.name = name.replace("-", "_")[-40:]
        self.output_topic = f"{name}-out"
        self.prefix = f"{name}."
        self.config = load_config(_config(tmp_path / "queries.yaml", self.name, input_topic, self.output_topic, groups))
        self.settings = Settings(
            KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=redis_url, STREAM_DP_GROUP_ID=f"{name}-g",
            STREAM_DP_INTERNAL_TOPIC_PREFIX=self.prefix, STREAM_DP_PARTIALS_PARTITIONS=2,
            STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef",
            STREAM_DP_INPUT_RETENTION_MS=3_600_000, STREAM_DP_LEDGER_TTL_S=LEDGER_TTL_S,
        )
        self.redis = redis.Redis.from_url(redis_url)
        self.ledger_prefix = f"{name}:ledger"
        self.ledger = RedisReleaseLedger(self.redis, prefix=self.ledger_prefix, ttl_s=LEDGER_TTL_S)

    def run(self, done: Callable[[CollectorRegistry], bool], *, clock_ms: Callable[[], int], timeout_s: float,
            settle_s: float = 0.0) -> CollectorRegistry:
        """Run a worker until ``done(its registry)`` or the timeout, ``settle_s`` more, then stop it cleanly."""
        registry = CollectorRegistry()
        worker = Worker(self.config, self.settings, registry=registry, ledger=self.ledger, clock_ms=clock_ms,
                        serve_metrics=False, client_id=f"{self.name}-worker")

        async def main() -> None:
            task = asyncio.create_task(worker.run())
            deadline = time.monotonic() + timeout_s
            try:
                while not await asyncio.to_thread(done, registry) and time.monotonic() < deadline:
                    if task.done():
                        task.result()  # the worker failed: raise its error
                    await asyncio.sleep(0.5)
                await asyncio.sleep(settle_s)  # time for anything it should not do
            finally:
                worker.request_stop()
                await task

        asyncio.run(main())
        return registry

    def releases(self) -> list[dict]:
        return [orjson.loads(r.value) for r in read_topic(self.bootstrap, self.output_topic)]

    def reset_release_group(self) -> None:
        """Forget the release group's offsets, as the broker does once the group is idle past offsets retention."""
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=f"{self.name}-test-admin")
        try:
            group = f"{self.settings.group_id}-release"
            for _ in range(20):
                error = admin.delete_groups([group])[group]  # "OK" or the error's name
                if error == "OK":
                    return
                time.sleep(0.5)  # e.g. not empty yet: the stopped worker is still leaving the group
            raise AssertionError(f"could not delete consumer group {group}: {error}")
        finally:
            admin.close()

    def expire_ledger(self) -> list[bytes]:
        """Delete every ledger key that has a TTL: what Redis does once the TTL has passed."""
        expiring = [key for key in self.redis.scan_iter(f"{self.ledger_prefix}:*") if self.redis.ttl(key) > 0]
        for key in expiring:
            self.redis.delete(key)
        return expiring

    def close(self) -> None:
        for key in self.redis.scan_iter(f"{self.ledger_prefix}:*"):
            self.redis.delete(key)
        self.redis.close()
        topics = [self.output_topic] + [f"{self.prefix}{t}" for t in ("partials", "alerts", "dead-letter")]
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=f"{self.name}-test-admin")
        try:
            with contextlib.suppress(KafkaError):  # housekeeping: must not mask the test's outcome
                admin.delete_topics(topics)
        finally:
            admin.close()


@pytest.fixture
def deployment(request, tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name):
    input_topic = new_topic("in", partitions=2)
    made = _Deployment(tmp_path, kafka_bootstrap, redis_url, unique_name, input_topic, request.param)
    made.input_topic = input_topic
    yield made
    made.close()


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _first_release(d: _Deployment) -> tuple[list[dict], list[int], int]:
    """Backfill two data windows, release them, stop. Returns the releases, data windows and partials sent."""
    first = (_wall_ms() - 10 * MIN) // MIN * MIN
    data_windows = [first + 2 * MIN * k for k in range(DATA_WINDOWS)]
    producer = KafkaProducer(bootstrap_servers=d.bootstrap, acks="all")
    try:
        for start in data_windows:
            for u in range(UNITS):
                event = {"user_id": f"u{u}", "ts": start + 1_000 + 997 * u, "page": "a" if u % 2 else "b"}
                producer.send(d.input_topic, key=f"u{u}".encode(), value=orjson.dumps(event), timestamp_ms=event["ts"])
        producer.flush()
    finally:
        producer.close()

    def data_released(_registry) -> bool:
        return {r["window"]["start_ms"] for r in d.releases()} >= set(data_windows)

    registry = d.run(data_released, clock_ms=_wall_ms, timeout_s=90)
    releases = d.releases()
    assert {r["window"]["start_ms"] for r in releases} >= set(data_windows), f"first release incomplete: {releases}"
    partials = registry.get_sample_value("stream_dp_windows_closed_total", {"query": d.name})
    assert partials and partials >= DATA_WINDOWS, partials
    return releases, data_windows, int(partials)


def _by_window(releases: list[dict]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = collections.defaultdict(list)
    for r in releases:
        out[r["window"]["start_ms"]].append(orjson.dumps(r, option=orjson.OPT_SORT_KEYS))
    return out


def _metric(registry: CollectorRegistry, name: str, query: str) -> float:
    return registry.get_sample_value(name, {"query": query}) or 0.0


@pytest.mark.parametrize("deployment", ["public", "selected"], indirect=True)
def test_partials_older_than_the_ledger_ttl_are_never_released_again(deployment):
    d = deployment
    first, _, partials = _first_release(d)
    last_first = max(r["window"]["start_ms"] for r in first)

    # More than the ledger TTL passes: window entries are gone, the release group's offsets too.
    expired = d.expire_ledger()
    assert any(b":released-through:" not in key for key in expired), "no window entry had a TTL"
    d.reset_release_group()
    ahead_ms = LEDGER_TTL_S * 1000 + 10 * MIN
    started_ms = _wall_ms() + ahead_ms
    public = d.config.queries[0].public_group_keys() is not None

    def done(r: CollectorRegistry) -> bool:
        if _metric(r, "stream_dp_partials_expired_total", d.name) < partials:
            return False
        # Public groups: also the empty windows since, the old ones dropped, the young ones released.
        return not public or (_metric(r, "stream_dp_windows_expired_total", d.name) > 0
                              and _metric(r, "stream_dp_windows_released_total", d.name) > 0)

    registry = d.run(done, clock_ms=lambda: _wall_ms() + ahead_ms, timeout_s=40, settle_s=3)
    after = d.releases()

    before, now = _by_window(first), _by_window(after)
    for start in sorted(before):
        assert sorted(now[start]) == sorted(before[start]), (
            f"window {start} was released again after its ledger entry expired:\n"
            f"first: {sorted(before[start])}\nnow:   {sorted(now[start])}"
        )
    limit_ms = d.settings.release_age_limit_ms
    for start in set(now) - set(before):
        # Only windows never released before: empty public windows after the first run's,
        # young enough for the ledger to vouch for (older ones are counted as expired).
        assert start > last_first and start + MIN > started_ms - limit_ms, (start, last_first, started_ms)
    assert _metric(registry, "stream_dp_partials_expired_total", d.name) == partials
    assert _metric(registry, "stream_dp_windows_released_total", d.name) == len(set(now) - set(before))
    if public:
        # Empty windows from the first run's last release to the age limit: not released.
        assert _metric(registry, "stream_dp_windows_expired_total", d.name) > 0
    else:
        assert set(now) == set(before)


@pytest.mark.parametrize("deployment", ["public", "selected"], indirect=True)
def test_a_replay_within_the_ledger_ttl_publishes_the_stored_records_only(deployment):
    d = deployment
    first, data_windows, _ = _first_release(d)
    last_first = max(r["window"]["start_ms"] for r in first)

    # As if the first worker died between each ledger write and its publish.
    for start in data_windows:
        assert d.redis.hset(f"{d.ledger_prefix}:{{{d.name}}}:{start}", "state", "written") == 0
    d.reset_release_group()
    registry = d.run(lambda r: _metric(r, "stream_dp_windows_republished_total", d.name) >= DATA_WINDOWS,
                     clock_ms=_wall_ms, timeout_s=40, settle_s=3)
    after = d.releases()

    assert _metric(registry, "stream_dp_windows_republished_total", d.name) == DATA_WINDOWS
    assert _metric(registry, "stream_dp_partials_expired_total", d.name) == 0
    before, now = _by_window(first), _by_window(after)
    for start in data_windows:
        # Published twice, the same records both times (same release ids, same noisy values).
        assert sorted(now[start]) == sorted(before[start] * 2), (start, before[start], now[start])
    for start in set(before) - set(data_windows):
        assert now[start] == before[start], start
    assert all(start > last_first for start in set(now) - set(before))
