"""A window is released once for every query option: a replay publishes the stored records, never new draws.

One in-process worker runs one query per option -- top_k, quantiles, a
three-level hierarchy, a continual running total, the staircase mechanism,
mean_vector and covariance (Gaussian), sample_aggregate and local DP -- over
three backfilled one-minute windows, the first three of a continual period
of four. Once it has published them all, every query's ledger entry of each
data window is marked unpublished (as if the worker died between the ledger
write and the publish), the release group loses its offsets, and a second
worker replays the whole partials topic. The README's guarantee: the stored
records are published again, byte for byte (same noisy values, same release
time), and counted in ``stream_dp_windows_republished_total``; a drawn-again
record would differ in its noisy values and its ``released_at`` (the local DP
query's, whose noise its producers drew, in ``released_at`` only).

The continual query's second and third windows are mid-period: a replay that
drew them again would also continue the tree from other noise, so its
running totals are checked by name as well.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import yaml
from kafka import KafkaProducer

from stream_dp.cli.local_reports import local_reports
from tests.worker._release_once import Deployment, by_window, metric, wall_ms
from tests.worker._support import PRODUCER_STAMPED, page_query

pytestmark = [pytest.mark.services, pytest.mark.slow]

MIN = 60_000
PERIOD_WINDOWS = 4
DATA_WINDOWS = 3  # the first three windows of a period: the replay of the second and third is mid-period
UNITS = 40
PAGE_EVENTS = {"a": 3, "b": 2, "c": 1}  # events per unit, window and page
PLACES = {"a": ("FR", "IDF", "Paris"), "b": ("FR", "ARA", "Lyon"), "c": ("DE", "BE", "Berlin")}
BROWSERS = ["chrome", "safari", "firefox", "edge"]  # the local_dp query's domain
LEDGER_TTL_S = 8_200
# records per window: one per group, a top_k record beside them, every prefix of the hierarchy (2 + 3 + 3)
RECORDS = {"top": len(PAGE_EVENTS) + 1, "places": 8, "local": len(BROWSERS)}
OPTIONS = ("top", "quantiles", "places", "today", "stairs", "vec", "cov", "median", "local")


def _query(name: str, topic: str, output: str, namespace: str, publish_from_ms: int, **options) -> dict:
    return page_query(name, topic, output, namespace, pages=PAGE_EVENTS, window="1m", release_timeout="20s",
                      publish_from_ms=publish_from_ms, **{"epsilon": 2.0, **options})


def _config(path: Path, names: dict[str, str], outputs: dict[str, str], topic: str, local_topic: str,
            namespace: str, publish_from_ms: int) -> Path:
    sum_ = {"field": "value", "clip": [0, 100]}
    queries = {
        "top": dict(aggregations={"count": {}, "top_k": {"k": 2}}),
        "quantiles": dict(aggregations={
            "count": {}, "quantiles": {"field": "value", "q": [0.5, 0.9], "bounds": [0, 100], "bins": 100,
                                       "value_interval": True}}),
        "places": dict(group_by=["country", "region", "city"], groups={"public": [list(p) for p in PLACES.values()]},
                       hierarchy={"split": [1, 1, 2]}, aggregations={"count": {}, "sum": sum_}),
        "today": dict(continual={"period": f"{PERIOD_WINDOWS}m", "max_windows_per_unit": 2},
                      aggregations={"count": {}, "sum": sum_}),
        "stairs": dict(mechanism="staircase", aggregations={"count": {}, "sum": sum_, "mean": {"field": "value"}}),
        "vec": dict(mechanism="gaussian", delta=1e-5,
                    aggregations={"mean_vector": {"fields": ["vx", "vy"], "clip_norm": 8.0}}),
        "cov": dict(mechanism="gaussian", delta=1e-5,
                    aggregations={"count": {}, "covariance": {"fields": ["vx", "vy"], "clip_norm": 8.0}}),
        "median": dict(aggregations={"sample_aggregate": {
            "function": "statistics:median", "field": "value", "blocks": 4, "output_range": [0, 100],
            "timeout": "200ms"}}),
        "local": dict(input_topic=local_topic, group_by=["browser"], groups={"public": BROWSERS},
                      bounds={"max_groups_per_unit": 1, "max_events_per_group": 1}, aggregations={"count": {}},
                      local_dp={"field": "browser", "mechanism": "krr", "epsilon": 2.0}),
    }
    assert set(queries) == set(OPTIONS)
    path.write_text(yaml.safe_dump({
        "namespaces": {namespace: {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]}},
        "queries": [_query(names[k], topic, outputs[k], namespace, publish_from_ms, **options)
                    for k, options in queries.items()],
    }))
    return path


def _event(unit: int, page: str, e: int, ts: int) -> dict:
    country, region, city = PLACES[page]
    return {"user_id": f"u{unit}", "ts": ts, "page": page, "value": float(1 + (unit * 3 + e) % 90),
            "country": country, "region": region, "city": city,
            "vx": float(1 + unit % 5), "vy": float((unit * 7) % 11 - 5)}


def _backfill(d: Deployment, config: Path, topic: str, local_topic: str, local_name: str, starts: list[int],
              secret: Path) -> None:
    """The events of ``starts``' windows, and the local_dp query's randomized reports (as ``produce --local-dp``)."""
    events = [_event(u, page, e, start + 50 * u + e)
              for start in starts for u in range(UNITS) for page, n in PAGE_EVENTS.items() for e in range(n)]
    truths = [orjson.dumps({"user_id": f"u{u}", "ts": start + 50 * u, "browser": BROWSERS[u % len(BROWSERS)]})
              for start in starts for u in range(UNITS)]
    reports = local_reports(SimpleNamespace(config=config, query=local_name, local_dp="browser", topic=local_topic,
                                            local_dp_secret_file=secret))
    assert reports is not None
    sent = list(reports.apply((None, value, orjson.loads(value)["ts"]) for value in truths))
    assert len(sent) == len(truths)  # one report per unit and window
    producer = KafkaProducer(bootstrap_servers=d.bootstrap, acks="all")
    try:
        for event in events:
            producer.send(topic, key=event["user_id"].encode(), value=orjson.dumps(event), timestamp_ms=event["ts"])
        for key, value, ms in sent:
            producer.send(local_topic, key=key, value=value, timestamp_ms=ms)
        producer.flush()
    finally:
        producer.close()


def _differing_fields(first: list[bytes], again: list[bytes]) -> str:
    """How the replay's records of a window differ from the first run's: the fields of each record (paired by
    release id) that changed, which names what a re-draw gives away, and the records missing or extra."""
    before = {r["release_id"]: r for r in map(orjson.loads, first)}
    stored = set(first)
    changed: set[str] = set()
    extra = 0
    for record in (orjson.loads(r) for r in again if r not in stored):
        old = before.get(record["release_id"])
        if old is None:
            extra += 1
            continue
        changed |= {k for k in old.keys() | record.keys() if old.get(k) != record.get(k)}
    counts = f"{len(first)} records first, {len(again)} after the replay (twice as many expected)"
    return f"fields {', '.join(sorted(changed)) or 'none'}; {extra} records of other release ids; {counts}"


def test_a_replay_republishes_every_options_stored_records(tmp_path, kafka_bootstrap, redis_url, new_topic,
                                                            unique_name):
    topic = new_topic("in", partitions=2, configs=PRODUCER_STAMPED)
    local_topic = new_topic("local", partitions=2, configs=PRODUCER_STAMPED)
    tag = f"once_{unique_name[-8:]}"  # the fixture's random suffix
    names = {k: f"{tag}_{k}" for k in OPTIONS}
    outputs = {k: f"{unique_name}-out-{k}" for k in OPTIONS}
    namespace = f"{unique_name}-users"
    period_ms = PERIOD_WINDOWS * MIN
    period = (wall_ms() - 10 * MIN) // period_ms * period_ms
    starts = [period + k * MIN for k in range(DATA_WINDOWS)]
    # a backfill, published from its first window (the workers' first start is later)
    config = _config(tmp_path / "queries.yaml", names, outputs, topic, local_topic, namespace, period)
    (secret := tmp_path / "local-dp.key").write_bytes(b"producer-key-0123456789abcdef-01")
    d = Deployment(kafka_bootstrap, redis_url, unique_name, config, ledger_ttl_s=LEDGER_TTL_S,
                   output_topics=outputs.values())
    try:
        _backfill(d, config, topic, local_topic, names["local"], starts, secret)

        # First run: until every query's data windows are published (the ledger says so, after the publish).
        def all_published(_registry) -> bool:
            return all((s := d.ledger.get(q, start)) is not None and s.published
                       for q in names.values() for start in starts)

        d.run(all_published, clock_ms=wall_ms, timeout_s=90)
        assert all_published(None), "the first run did not publish every data window within 90 s"
        before = {k: by_window(d.releases(outputs[k])) for k in OPTIONS}
        for k in OPTIONS:
            counts = [len(before[k][start]) for start in starts]
            assert counts == [RECORDS.get(k, len(PAGE_EVENTS))] * DATA_WINDOWS, f"{names[k]}: records {counts}"
        # the data reached every query: the local reports (not dead-lettered), the continual period from its start
        for start in starts:
            local = [orjson.loads(r) for r in before["local"][start]]
            assert all(r["local_dp"]["reports"] == UNITS for r in local), local
            today = {orjson.loads(r)["continual"]["window_index"] for r in before["today"][start]}
            assert today == {(start - period) // MIN + 1}, today

        # As if the worker died between each ledger write and its publish, for every query and data window.
        for q in names.values():
            for start in starts:
                d.mark_written(q, start)
        d.reset_release_group()
        registry = d.run(
            lambda r: all(metric(r, "stream_dp_windows_republished_total", q) >= DATA_WINDOWS for q in names.values()),
            clock_ms=wall_ms, timeout_s=60, settle_s=3)
        now = {k: by_window(d.releases(outputs[k])) for k in OPTIONS}
    finally:
        d.close()

    # The continual query's running totals (the tree's state after each window) are the first run's.
    def totals(records: list[bytes]) -> list[tuple]:
        return sorted((r["group"]["page"], r["continual"]["window_index"], r["count"], r["sum"])
                      for r in map(orjson.loads, records))

    failures = []
    for start in starts:
        first_totals = totals(before["today"][start])
        if totals(now["today"][start]) != sorted(first_totals * 2):
            failures.append(f"continual query {names['today']}: the replay's running totals of window {start} differ "
                            f"from the first run's {first_totals}: {totals(now['today'][start])}")
    for k in OPTIONS:
        q, first, again = names[k], before[k], now[k]
        republished = metric(registry, "stream_dp_windows_republished_total", q)
        if republished != DATA_WINDOWS:
            failures.append(f"{q}: {republished:g} windows counted republished, not {DATA_WINDOWS}")
        if expired := metric(registry, "stream_dp_partials_expired_total", q):
            failures.append(f"{q}: {expired:g} partials dropped as expired")
        for start in starts:
            # Published twice, the same records both times: the second publication is a copy of the first.
            if sorted(again[start]) != sorted(first[start] * 2):
                failures.append(f"{q}: window {start} was not republished as stored: "
                                f"{_differing_fields(first[start], again[start])}")
        for start in set(first) - set(starts):  # released once, not touched by the replay
            if again[start] != first[start]:
                failures.append(f"{q}: window {start}, released before the replay, was published again")
        # Windows the first run had not reached (empty ones of public groups, each partials partition going at
        # its own pace) are released by the replay for the first time: once.
        for start in set(again) - set(first):
            ids = [orjson.loads(r)["release_id"] for r in again[start]]
            if len(set(ids)) != len(ids):
                failures.append(f"{q}: window {start}, first released by the replay, was published twice")
    assert not failures, "\n".join(failures)
