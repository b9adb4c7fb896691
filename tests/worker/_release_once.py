"""Helpers of the release-once tests: a deployment run by in-process workers, its ledger and release group.

A deployment is one worker config (any number of queries and input topics),
its internal topics and settings, and the release ledger in the real Redis.
Workers run in this process one after the other against it, so a test can
stop one, change what the ledger or the broker remembers, and start another.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import redis
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from stream_dp.config import Settings, load_config
from stream_dp.worker.app import Worker
from stream_dp.worker.store.ledger import RedisReleaseLedger
from tests.reliability.topics import read_topic

SECRET = "test-secret-0123456789abcdef"


class Deployment:
    """A config's topics, settings and ledger (all named after ``tag``), and the in-process workers run on them."""

    def __init__(self, bootstrap: str, redis_url: str, tag: str, config_path: Path, *, ledger_ttl_s: int,
                 output_topics: Iterable[str]):
        self.bootstrap = bootstrap
        self.tag = tag
        self.prefix = f"{tag}."
        self.output_topics = list(output_topics)
        self.config = load_config(config_path)
        self.settings = Settings(
            KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=redis_url, STREAM_DP_GROUP_ID=f"{tag}-g",
            STREAM_DP_INTERNAL_TOPIC_PREFIX=self.prefix, STREAM_DP_PARTIALS_PARTITIONS=2,
            STREAM_DP_CONTRIBUTION_SECRET=SECRET,
            STREAM_DP_INPUT_RETENTION_MS=3_600_000, STREAM_DP_LEDGER_TTL_S=ledger_ttl_s,
        )
        self.redis = redis.Redis.from_url(redis_url)
        self.ledger_prefix = f"{tag}:ledger"
        self.ledger = RedisReleaseLedger(self.redis, prefix=self.ledger_prefix, ttl_s=ledger_ttl_s)
        self.client_id = tag.replace("-", "_")[-40:]

    def run(self, done: Callable[[CollectorRegistry], bool], *, clock_ms: Callable[[], int], timeout_s: float,
            settle_s: float = 0.0) -> CollectorRegistry:
        """Run a worker until ``done(its registry)`` or the timeout, ``settle_s`` more, then stop it cleanly."""
        registry = CollectorRegistry()
        worker = Worker(self.config, self.settings, registry=registry, ledger=self.ledger, clock_ms=clock_ms,
                        serve_metrics=False, client_id=f"{self.client_id}-worker")

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

    def releases(self, topic: str) -> list[dict]:
        return [orjson.loads(r.value) for r in read_topic(self.bootstrap, topic)]

    def reset_release_group(self) -> None:
        """Forget the release group's offsets, as the broker does once the group is idle past offsets retention."""
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}-test-admin")
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

    def mark_written(self, query: str, window_start_ms: int) -> None:
        """Make a published window's ledger entry unpublished: as if its worker died between the ledger write
        and the publish. The key is checked against the ledger's own reader before and after, so a changed key
        layout fails here rather than marking nothing."""
        stored = self.ledger.get(query, window_start_ms)
        assert stored is not None and stored.published, (
            f"{query}/{window_start_ms}: the ledger holds no published entry ({stored}); was the window released?")
        key = f"{self.ledger_prefix}:{{{query}}}:{window_start_ms}"
        assert self.redis.hset(key, "state", "written") == 0, f"{key} had no state field: not the entry's key"
        again = self.ledger.get(query, window_start_ms)
        assert again is not None and not again.published and again.payload == stored.payload, key

    def expire_ledger(self) -> list[bytes]:
        """Delete every ledger key that has a TTL: what Redis does once the TTL has passed."""
        # The shared Redis holds hundreds of thousands of other tests' keys: SCAN's default of 10 keys a
        # call made every scan here thousands of round trips (tens of seconds on a loaded machine).
        expiring = [key for key in self.redis.scan_iter(f"{self.ledger_prefix}:*", count=10_000) if self.redis.ttl(key) > 0]
        for key in expiring:
            self.redis.delete(key)
        return expiring

    def close(self) -> None:
        for key in self.redis.scan_iter(f"{self.ledger_prefix}:*", count=10_000):
            self.redis.delete(key)
        self.redis.close()
        topics = self.output_topics + [f"{self.prefix}{t}" for t in ("partials", "alerts", "dead-letter")]
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}-test-admin")
        try:
            with contextlib.suppress(KafkaError):  # housekeeping: must not mask the test's outcome
                admin.delete_topics(topics)
        finally:
            admin.close()


def wall_ms() -> int:
    return int(time.time() * 1000)


def by_window(releases: list[dict]) -> dict[int, list[bytes]]:
    """Each window's records as sorted-key JSON: equal bytes are equal records, whatever the field order."""
    out: dict[int, list[bytes]] = collections.defaultdict(list)
    for r in releases:
        out[r["window"]["start_ms"]].append(orjson.dumps(r, option=orjson.OPT_SORT_KEYS))
    return out


def metric(registry: CollectorRegistry, name: str, query: str) -> float:
    return registry.get_sample_value(name, {"query": query}) or 0.0
