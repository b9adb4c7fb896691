"""A window is released at most once, forever: a release group reset to the
start of the partials topic never releases a window a second time.

One in-process worker releases two data windows (a backfill stamped ten
minutes ago, 60 units on two input partitions; public groups publish from
``window.publish_from``, 15 minutes ago). Then the release consumer
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

from pathlib import Path

import orjson
import pytest
import yaml
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from tests.worker._release_once import Deployment, by_window, metric, wall_ms
from tests.worker._support import BACKFILL, PRODUCER_STAMPED, iso_ms

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
            "window": {"size": "1m", "allowed_lateness": "1s", "idle_timeout": "2s",
                       # a backfill: public groups publish from before it (``_first_release``)
                       **({"publish_from": iso_ms(wall_ms() - 15 * MIN)} if groups == "public" else {})},
            "group_by": ["page"], "groups": GROUPS[groups],
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}},
            "epsilon": 1.0, "release_timeout": "20s",
            **BACKFILL,  # windows minutes old, their records stamped with their events' times
        }],
    }))
    return path


class _Deployment(Deployment):
    """One count query's deployment; ``name`` is the query's name."""

    def __init__(self, tmp_path: Path, bootstrap: str, redis_url: str, name: str, input_topic: str, groups: str):
        self.name = name.replace("-", "_")[-40:]
        self.output_topic = f"{name}-out"
        config = _config(tmp_path / "queries.yaml", self.name, input_topic, self.output_topic, groups)
        super().__init__(bootstrap, redis_url, name, config, ledger_ttl_s=LEDGER_TTL_S,
                         output_topics=[self.output_topic])

    def releases(self) -> list[dict]:  # type: ignore[override]
        return super().releases(self.output_topic)


@pytest.fixture
def deployment(request, tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name):
    input_topic = new_topic("in", partitions=2, configs=PRODUCER_STAMPED)
    made = _Deployment(tmp_path, kafka_bootstrap, redis_url, unique_name, input_topic, request.param)
    made.input_topic = input_topic
    yield made
    made.close()


def _first_release(d: _Deployment) -> tuple[list[dict], list[int], int]:
    """Backfill two data windows, release them, stop. Returns the releases, data windows and partials sent."""
    first = (wall_ms() - 10 * MIN) // MIN * MIN
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

    registry = d.run(data_released, clock_ms=wall_ms, timeout_s=90)
    releases = d.releases()
    assert {r["window"]["start_ms"] for r in releases} >= set(data_windows), f"first release incomplete: {releases}"
    partials = registry.get_sample_value("stream_dp_windows_closed_total", {"query": d.name})
    assert partials and partials >= DATA_WINDOWS, partials
    return releases, data_windows, int(partials)


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
    started_ms = wall_ms() + ahead_ms
    public = d.config.queries[0].public_group_keys() is not None

    def done(r: CollectorRegistry) -> bool:
        if metric(r, "stream_dp_partials_expired_total", d.name) < partials:
            return False
        # Public groups: also the empty windows since, the old ones dropped, the young ones released.
        return not public or (metric(r, "stream_dp_windows_expired_total", d.name) > 0
                              and metric(r, "stream_dp_windows_released_total", d.name) > 0)

    registry = d.run(done, clock_ms=lambda: wall_ms() + ahead_ms, timeout_s=40, settle_s=3)
    after = d.releases()

    before, now = by_window(first), by_window(after)
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
    assert metric(registry, "stream_dp_partials_expired_total", d.name) == partials
    assert metric(registry, "stream_dp_windows_released_total", d.name) == len(set(now) - set(before))
    if public:
        # Empty windows from the first run's last release to the age limit: not released.
        assert metric(registry, "stream_dp_windows_expired_total", d.name) > 0
    else:
        assert set(now) == set(before)


@pytest.mark.parametrize("deployment", ["public", "selected"], indirect=True)
def test_a_replay_within_the_ledger_ttl_publishes_the_stored_records_only(deployment):
    d = deployment
    first, data_windows, _ = _first_release(d)
    last_first = max(r["window"]["start_ms"] for r in first)

    # As if the first worker died between each ledger write and its publish.
    for start in data_windows:
        d.mark_written(d.name, start)
    d.reset_release_group()
    registry = d.run(lambda r: metric(r, "stream_dp_windows_republished_total", d.name) >= DATA_WINDOWS,
                     clock_ms=wall_ms, timeout_s=40, settle_s=3)
    after = d.releases()

    assert metric(registry, "stream_dp_windows_republished_total", d.name) == DATA_WINDOWS
    assert metric(registry, "stream_dp_partials_expired_total", d.name) == 0
    before, now = by_window(first), by_window(after)
    for start in data_windows:
        # Published twice, the same records both times (same release ids, same noisy values).
        assert sorted(now[start]) == sorted(before[start] * 2), (start, before[start], now[start])
    for start in set(before) - set(data_windows):
        assert now[start] == before[start], start
    assert all(start > last_first for start in set(now) - set(before))
