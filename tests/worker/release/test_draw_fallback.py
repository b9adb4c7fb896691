"""A window whose release cannot be built from its data is published as if empty, never left out.

An in-process worker on the real broker and Redis, whose release build is doctored to raise for any window
holding data (as a bug the data hits would). The data window must be published like any other -- every
public group, noise only, its records flagged ``as_if_empty: release_failed`` -- counted and logged, and
stored in the ledger once; the empty windows after it are published as usual. Before, the window was
withheld: no record of it at all, while the empty windows around it were published.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
import yaml
from kafka import KafkaProducer

from stream_dp.worker.release import draw as release_draw
from tests.worker._release_once import Deployment, wall_ms

pytestmark = [pytest.mark.services]

WINDOW_MS = 2_000
PAGES = ["/a", "/b", "/c"]


def _config(path: Path, name: str, input_topic: str, output_topic: str) -> Path:
    path.write_text(yaml.safe_dump({
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
        "queries": [{
            "name": name, "input_topic": input_topic, "output_topic": output_topic,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"},
            "timestamp_field": "ts",
            "window": {"size": "2s", "allowed_lateness": "500ms", "idle_timeout": "2s"},
            "group_by": ["page"], "groups": {"public": PAGES},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2},
            "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 10]}},
            "epsilon": 1.0, "release_timeout": "20s",
        }],
    }))
    return path


def test_a_window_whose_build_fails_is_published_as_if_empty(tmp_path, kafka_bootstrap, redis_url, new_topic,
                                                               unique_name, monkeypatch, caplog):
    input_topic = new_topic("in", partitions=1)
    name = unique_name.replace("-", "_")[-40:]
    output = f"{unique_name}-out"
    config = _config(tmp_path / "q.yaml", name, input_topic, output)
    deployment = Deployment(kafka_bootstrap, redis_url, unique_name, config, ledger_ttl_s=8_200, output_topics=[output])
    real_build = release_draw.build_release
    failed: list[int] = []

    def doctored(query, window, *args, **kwargs):  # a build error that windows with data hit
        if window.withheld is None and int(window.count.sum()) > 0:
            failed.append(window.window_start_ms)
            raise ValueError("doctored: this window's data breaks the release build")
        return real_build(query, window, *args, **kwargs)

    monkeypatch.setattr(release_draw, "build_release", doctored)
    # the events of one window, sent live once the worker runs (the first window it closes is this one)
    data_window = (wall_ms() // WINDOW_MS + 4) * WINDOW_MS
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = [False]

    def released_past_the_data(_registry) -> bool:
        if not sent[0] and wall_ms() >= data_window + 50:
            for u in range(20):
                event = {"user_id": f"u{u}", "ts": data_window + 100 + u, "page": PAGES[u % 3], "value": 5.0}
                producer.send(input_topic, key=f"u{u}".encode(), value=orjson.dumps(event), timestamp_ms=event["ts"])
            producer.flush()
            sent[0] = True
        return sent[0] and any(r["window"]["start_ms"] >= data_window + 2 * WINDOW_MS for r in deployment.releases(output))

    try:
        with caplog.at_level(logging.ERROR, logger="stream_dp.worker.release.draw"):
            registry = deployment.run(released_past_the_data, clock_ms=wall_ms, timeout_s=120)
        records = deployment.releases(output)
        ledger = deployment.ledger.get(name, data_window)
    finally:
        producer.close()
        deployment.close()
    assert failed == [data_window], f"the doctored build failed for {failed}, expected the data window only"
    published = {}
    for r in records:
        published.setdefault(r["window"]["start_ms"], []).append(r)
    # published like every window: each public group once, noise only and flagged as such
    data = published.get(data_window, [])
    assert sorted(r["group"]["page"] for r in data) == PAGES, data
    assert all(r["as_if_empty"] == "release_failed" for r in data), data
    later = [r for start, rs in published.items() if start > data_window for r in rs]
    assert later and not any("as_if_empty" in r for r in later), later
    assert ledger is not None and ledger.published  # stored once, before it was published
    value = registry.get_sample_value
    assert value("stream_dp_windows_withheld_total", {"query": name, "reason": "release_failed"}) == 1
    assert value("stream_dp_internal_errors_total", {"kind": "release_failed"}) == 1
    assert any("could not be built from its data; it is released as if empty" in r.getMessage()
               for r in caplog.records), caplog.text
