"""A window of a million groups on a broker with its default record limit (``message.max.bytes`` 1 MB).

Real broker, real Redis, worker processes: one window of 1,000,000 groups
(workload: ``_big_window``) is released with no worker exiting, and every
group that passed selection -- the groups the release ledger stored as
released -- appears on the output topic exactly once. The window's partials
cross the partials topic in chunk records within the broker's limit.

An older worker (one JSON record per partial) exits with
``MessageSizeTooLargeError`` here: run these tests with
``STREAM_DP_TEST_WORKER_PYTHONPATH=<older source tree>`` to see it.
"""

from __future__ import annotations

import collections
import os
import time

import pytest
import redis
from kafka.admin import KafkaAdminClient

from stream_dp.wire import is_binary, read_prefix
from stream_dp.worker.release.entry import decode_entry
from stream_dp.worker.store.ledger import RedisReleaseLedger
from tests.worker._big_window import (
    GROUPS,
    LEDGER_PREFIX,
    POPULAR_EVERY,
    POPULAR_UNITS,
    SECRET,
    WINDOW_MS,
    delete_redis_keys,
    group_name,
    popular,
    produce,
    read_topic,
    released_groups,
    start_workers,
    wait_published,
    write_config,
)
from tests.worker._support import PRODUCER_STAMPED, free_port, metric_sum, scrape

BROKER_DEFAULT_MAX = 1_048_588  # Kafka's message.max.bytes default


def _run(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name, *, partitions: int, workers: int) -> None:
    started = time.monotonic()
    name = unique_name.replace("-", "_")[-40:]
    input_topic = new_topic("in", partitions=partitions, configs=PRODUCER_STAMPED)
    output_topic = f"{unique_name}-out"
    prefix = f"{unique_name}."
    config = write_config(tmp_path / "queries.yaml", name, input_topic, output_topic)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    client = redis.Redis.from_url(redis_url)
    window_start = (int(time.time() * 1000) - 5 * WINDOW_MS) // WINDOW_MS * WINDOW_MS
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=prefix,
               STREAM_DP_CONTRIBUTION_SECRET=SECRET)
    # A backlog: the window ended minutes ago, so it is in the topic before any worker reads it (a worker
    # already watching an empty partition would close the window by the wall clock, making it all late).
    sent = produce(kafka_bootstrap, input_topic, window_start)
    produced_s = time.monotonic() - started
    pool = start_workers(tmp_path, config, env, [free_port() for _ in range(workers)])
    try:
        wait_published(client, name, window_start, pool, timeout_s=150)
        released_s = time.monotonic() - started
        assert pool.alive(), pool.log_text()

        # What passed selection: the groups the ledger stored as the window's release.
        stored = RedisReleaseLedger(client).get(name, window_start)
        assert stored is not None and stored.published
        entry = decode_entry(stored.payload)
        (column,) = entry.groups
        selected = set(column)
        assert len(selected) == entry.rows

        # Each of them on the output topic exactly once, and nothing else.
        records = read_topic(kafka_bootstrap, output_topic)
        released = released_groups(records)
        per_group = collections.Counter(group for group, _, _ in released)
        assert len(released) == len(per_group), [g for g, n in per_group.items() if n > 1][:5]
        assert set(per_group) == selected
        assert {start for _, start, _ in released} == {window_start}

        # Selection as the workload makes it (see _big_window): about the popular groups.
        popular_groups = {group_name(g) for g in range(0, GROUPS, POPULAR_EVERY)}
        assert len(selected & popular_groups) >= len(popular_groups) - 5
        assert len(selected - popular_groups) <= 5
        counts = [count for group, _, count in released if group in popular_groups]
        assert all(abs(count - POPULAR_UNITS) <= 3 for count in counts)  # count noise scale 0.2

        # The window's partials went through in chunk records within the broker's limit.
        partials = [m for m in read_topic(kafka_bootstrap, f"{prefix}partials") if is_binary(m.value())]
        sizes = [len(m.value()) + len(m.key() or b"") for m in partials]
        chunks = [read_prefix(m.value(), "")[1] for m in partials]
        assert max(sizes) < BROKER_DEFAULT_MAX
        assert sum(1 for c in chunks if c["chunk"][0] == 0) >= partitions  # one partial per input partition (or a replay)
        assert max(c["chunk"][1] for c in chunks) > 1  # a partial took several records
        payload_bytes = sum(c["size"] for c in chunks if c["chunk"][0] == 0)

        texts = [scrape(port) for port in pool.ports]
        accepted = sum(metric_sum(t, "stream_dp_events_total", query=name, outcome="accepted") for t in texts)
        assert accepted == sent if workers == 1 else accepted >= sent  # a rebalance re-reads (and counts) some
        assert sum(metric_sum(t, "stream_dp_events_total", query=name, outcome="late") for t in texts) == 0
        assert sum(metric_sum(t, "stream_dp_windows_released_total", query=name) for t in texts) == 1
        assert sum(metric_sum(t, "stream_dp_internal_errors_total") for t in texts) == 0
        assert pool.alive(), pool.log_text()
        if workers == 1:  # assigned once: no rebalance (a loop blocked past the session timeout would cause one)
            assert pool.log_text(tail=None).count("stream_dp.worker.ingest.stage: assigned") == 1, pool.log_text()
        stages = {op: sum(metric_sum(t, "stream_dp_release_stage_seconds_sum", query=name, operation=op) for t in texts)
                  for op in ("charge", "partial_send", "decode", "combine", "noise", "encode", "ledger", "render",
                             "publish")}
        print(
            f"\n[{partitions} partition(s), {workers} worker(s)] stage seconds: "
            + ", ".join(f"{op} {seconds:.2f}" for op, seconds in stages.items())
            + f"\n{sent} events, {GROUPS} groups, "
            f"{len(selected)} released; produced at {produced_s:.1f} s, published at {released_s:.1f} s; "
            f"partials {payload_bytes} bytes ({payload_bytes / GROUPS:.2f} bytes/group) in {len(partials)} records "
            f"(largest {max(sizes)}); ledger entry {len(stored.payload)} bytes; "
            f"peak RSS {', '.join(f'{mb:.0f} MB' for mb in pool.peak_rss_mb())}"
        )
    finally:
        pool.stop()
        topics = [output_topic, *(f"{prefix}{t}" for t in ("partials", "alerts", "dead-letter"))]
        present = [t for t in topics if t in set(admin.list_topics())]
        if present:
            admin.delete_topics(present)
        admin.close()
        delete_redis_keys(client, f"{LEDGER_PREFIX}:{{{name}}}*", f"{LEDGER_PREFIX}:units:{{{name}/*",
                          f"dp:*{name}-users*")
        client.close()


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.full  # the two-worker run below covers it: the same window, its partials crossing between workers
@pytest.mark.timeout(240)
def test_a_million_group_window_from_one_partition(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name):
    _run(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name, partitions=1, workers=1)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(240)
def test_a_million_group_window_from_three_partitions_and_two_workers(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name
):
    _run(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name, partitions=3, workers=2)
