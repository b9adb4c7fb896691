"""A Redis that lost its data is refused: nothing is charged or released on it.

One in-process worker releases two data windows (real broker, real Redis)
and commits its input offsets. Then the deployment's Redis keys are deleted
(what a flush, a restart without the append-only file or a new server does
to them) and the release group loses its offsets, so a second worker re-reads
the partials of windows already released. Without the guard it finds no
ledger entry for them and noises them again: the same release ids with new
values. With it the worker stops with ``StoreReplaced`` and the output topic
is unchanged. The same restart with the store intact runs and releases
nothing twice (the control).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from stream_dp.worker import app as worker_app
from stream_dp.worker.guard.store import MARKERS, StoreReplaced
from stream_dp.worker.kafka.admin import read_commit_metadata
from stream_dp.worker.kafka.commit_metadata import committed_store
from tests.worker._support import PRODUCER_STAMPED
from tests.worker._release_once import by_window, metric, wall_ms
from tests.worker.test_release_once import _Deployment, _first_release

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def deployment(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name):
    input_topic = new_topic("in", partitions=2, configs=PRODUCER_STAMPED)  # as test_release_once's
    made = _Deployment(tmp_path, kafka_bootstrap, redis_url, unique_name, input_topic, "public")
    made.input_topic = input_topic
    yield made
    made.close()


def _committed_tokens(d: _Deployment) -> dict[int, str | None]:
    partitions = [TopicPartition(d.input_topic, p) for p in range(2)]
    metadata = read_commit_metadata(d.settings.kafka_client_options(), d.settings.group_id, partitions)
    return {tp.partition: committed_store(text) for tp, text in metadata.items()}


def _wipe_store(d: _Deployment) -> int:
    """Delete every key of the deployment in Redis: its ledger (store markers included) and its budgets."""
    keys = [*d.redis.scan_iter(f"{d.ledger_prefix}:*", count=10_000),
            *d.redis.scan_iter(f"*{d.name}-users*", count=10_000)]
    if keys:  # in one command, as a flush does: a worker checking its markers meanwhile sees all or none gone
        d.redis.delete(*keys)
    return len(keys)


def test_a_restart_on_a_store_that_lost_its_data_releases_nothing(deployment):
    d = deployment
    first, data_windows, _ = _first_release(d)
    markers = d.ledger.store_markers().read()
    (token,) = set(markers)
    assert token is not None
    assert set(_committed_tokens(d).values()) == {token}, "the input commits must name the store"

    # Control: the same store, the release group reset: the stored releases stand, nothing is noised again.
    d.reset_release_group()
    registry = d.run(lambda r: metric(r, "stream_dp_partials_expired_total", d.name) >= 0, clock_ms=wall_ms,
                     timeout_s=20, settle_s=8)
    assert metric(registry, "stream_dp_internal_errors_total", d.name) == 0
    again = by_window(d.releases())
    for start in data_windows:
        assert set(again[start]) == set(by_window(first)[start]), f"window {start} changed on an intact store"

    before = d.releases()
    assert _wipe_store(d) > MARKERS_AT_LEAST
    d.reset_release_group()
    with pytest.raises(StoreReplaced, match=token):
        d.run(lambda r: False, clock_ms=wall_ms, timeout_s=30)
    after = d.releases()
    for start in data_windows:
        assert set(by_window(after)[start]) == set(by_window(before)[start]), f"window {start} was noised again"
    assert len(after) == len(before), (
        f"{len(after) - len(before)} records released on the emptied store:\n"
        f"{[r for r in after[len(before):]][:4]}"
    )
    assert d.ledger.store_markers().read() == [None] * len(markers), "refusing must not write markers"
    assert set(_committed_tokens(d).values()) == {token}, "the evidence in the commits must survive the refusal"


MARKERS_AT_LEAST = MARKERS  # the markers alone, besides the ledger entries and budgets


def test_a_store_emptied_under_a_running_worker_stops_it(deployment):
    """Redis restarts without its data while the worker runs: the worker's periodic check of the markers
    (every few seconds, and after any failed call) finds them gone and stops it."""
    d = deployment
    _first_release(d)
    wiped: list[int] = []

    def wipe_once_running(registry) -> bool:
        # Once the worker verified the store (at its assignment) and has run past a few charges' worth.
        if not wiped and (registry.get_sample_value("stream_dp_store_checks_total", {"outcome": "verified"}) or 0) >= 2:
            wiped.append(_wipe_store(d))
        return False

    with pytest.raises(StoreReplaced, match="holds no store token"):
        d.run(wipe_once_running, clock_ms=wall_ms, timeout_s=40)
    assert wiped and wiped[0] >= MARKERS_AT_LEAST
    assert d.ledger.store_markers().read() == [None] * MARKERS, "nothing may be written into the emptied store"


def _release_then_empty_the_store(d: _Deployment) -> tuple[str, list[dict]]:
    """Release two windows, then lose the store and the release group's offsets: the store's token and the
    records released."""
    _first_release(d)
    (token,) = set(d.ledger.store_markers().read())
    before = d.releases()
    _wipe_store(d)
    d.reset_release_group()
    return token, before


def _hold_partitions(d: _Deployment, members: int, stop: threading.Event) -> threading.Thread:
    """Consumers of the worker's group that take every input partition (their client ids sort first, so the
    range assignor hands them the partitions): the worker joins with none."""

    async def main() -> None:
        consumers = [AIOKafkaConsumer(bootstrap_servers=d.bootstrap, group_id=d.settings.group_id,
                                      client_id=f"0holder{i}", enable_auto_commit=False) for i in range(members)]
        for consumer in consumers:
            await consumer.start()
            consumer.subscribe([d.input_topic])
        try:
            while not stop.is_set():
                for consumer in consumers:
                    await consumer.getmany(timeout_ms=100)
            assert all(consumer.assignment() for consumer in consumers), "a holder ended without a partition"
        finally:
            for consumer in consumers:
                await consumer.stop()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    return thread


def test_a_worker_without_input_partitions_finds_the_groups_store_too(deployment):
    """More workers than input partitions: one holds only release homes. It must read the store the group's
    commits name (on every partition, not only its own), or it would take the emptied Redis for a new one and
    noise the re-read partials again."""
    d = deployment
    token, before = _release_then_empty_the_store(d)
    stop = threading.Event()
    holder = _hold_partitions(d, 2, stop)
    try:
        time.sleep(8)  # the holders own both input partitions
        with pytest.raises(StoreReplaced, match=token):
            d.run(lambda r: False, clock_ms=wall_ms, timeout_s=40)
    finally:
        stop.set()
        holder.join(20)
    assert len(d.releases()) == len(before)
    assert d.ledger.store_markers().read() == [None] * MARKERS


def test_unreadable_commits_hold_everything_until_they_are_read(deployment, monkeypatch):
    """The group coordinator does not answer (it is moving): no commit could be read, which is no evidence
    of a new deployment. Nothing is released, no marker written; once the commits are read, the emptied
    Redis is refused."""
    d = deployment
    token, before = _release_then_empty_the_store(d)

    def coordinator_moving(*args, **kwargs):
        raise RuntimeError("NotCoordinatorForGroup (the group coordinator is moving)")

    monkeypatch.setattr(worker_app, "read_commit_metadata", coordinator_moving)
    monkeypatch.setattr(worker_app, "read_group_metadata", coordinator_moving)
    registry = d.run(lambda r: False, clock_ms=wall_ms, timeout_s=25)
    assert len(d.releases()) == len(before)
    assert d.ledger.store_markers().read() == [None] * MARKERS
    assert (registry.get_sample_value("stream_dp_store_checks_total", {"outcome": "unanswered"}) or 0) > 0
    monkeypatch.undo()
    with pytest.raises(StoreReplaced, match=token):
        d.run(lambda r: False, clock_ms=wall_ms, timeout_s=30)
    assert len(d.releases()) == len(before)
