"""An output topic deleted under a running worker: the broker creates it again on the worker's next request
for it (``auto.create.topics.enable``, as Kafka's default and the test broker have it), the worker keeps
running, and every window it releases from then on lands in the new topic with the values its ledger stored.

One in-process worker, a query of two public groups and 2-second windows (public groups publish every
window, data or not: no input is needed). Once a window is released, the output topic is deleted; the
test ends three released windows later. Before, the librdkafka output producer raised the broker's
UNKNOWN_TOPIC_OR_PART on the first metadata request after the deletion and the worker exited.

The output topic has one partition, as the broker creates it again, so that records already in flight at the
deletion keep their partition.
"""

from __future__ import annotations

import orjson
import pytest
import yaml
from kafka.admin import KafkaAdminClient

from stream_dp.worker.release.entry import decode_entry
from tests.reliability.topics import read_topic
from tests.worker._release_once import Deployment, metric, wall_ms

pytestmark = [pytest.mark.services, pytest.mark.slow]

WINDOW_MS = 2_000
RELEASED_AFTER = 3  # windows released after the deletion before the test ends


def test_a_deleted_output_topic_is_created_again_and_every_later_window_lands_in_it(
        tmp_path, monkeypatch, kafka_bootstrap, redis_url, new_topic, unique_name):
    name = unique_name.replace("-", "_")[-40:]
    output = f"{unique_name}-out"
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 1000.0}]}},
        "queries": [{
            "name": name, "input_topic": new_topic("in"), "output_topic": output,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "2s", "allowed_lateness": "1s", "idle_timeout": "1s"},
            "group_by": ["page"], "groups": {"public": ["a", "b"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}}, "epsilon": 1.0, "release_timeout": "2s",
        }],
    }))
    monkeypatch.setenv("STREAM_DP_OUTPUT_PARTITIONS", "1")
    d = Deployment(kafka_bootstrap, redis_url, unique_name, tmp_path / "queries.yaml", ledger_ttl_s=8_200,
                   output_topics=[output])
    deleted: dict[str, float] = {}
    before: list = []  # the records of the topic as deleted

    def done(registry) -> bool:
        released = metric(registry, "stream_dp_windows_released_total", name)
        if not deleted:
            if released < 1:
                return False
            before.extend(read_topic(kafka_bootstrap, output))
            # Returns once the controller has deleted it. Not waited out in the metadata: the worker's next
            # publish (every 2 s) has the broker create it again at once.
            admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id=f"{name}-test-admin")
            try:
                admin.delete_topics([output])  # raises if the broker did not delete it
            finally:
                admin.close()
            deleted.update(at_ms=wall_ms(), released=released)
            return False
        return released >= deleted["released"] + RELEASED_AFTER

    try:
        registry = d.run(done, clock_ms=wall_ms, timeout_s=120)  # raises the worker's error if it stopped
        assert deleted, "no window was released before the deletion"
        released = metric(registry, "stream_dp_windows_released_total", name)
        assert released >= deleted["released"] + RELEASED_AFTER, (
            f"{released - deleted['released']:.0f} windows released after {output} was deleted, not {RELEASED_AFTER}")
        records = read_topic(kafka_bootstrap, output)
        values: dict[int, set[bytes]] = {}
        for record in records:
            values.setdefault(int(orjson.loads(record.value)["window"]["start_ms"]), set()).add(record.value)
        # Every window that closed after the deletion (its end, plus lateness, past it) is in the new topic.
        first_after = -(-(int(deleted["at_ms"]) - WINDOW_MS) // WINDOW_MS) * WINDOW_MS  # the first ending after it
        expected = set(range(first_after, max(values, default=0) + WINDOW_MS, WINDOW_MS))
        assert len(expected) >= RELEASED_AFTER - 1 and expected <= set(values), (
            f"windows missing from {output} after its deletion at {deleted['at_ms']:.0f}: "
            f"{sorted(expected - set(values))} (it holds {sorted(values)})")
        gone = {int(orjson.loads(record.value)["window"]["start_ms"]) for record in before}
        assert gone and not gone & set(values), f"{output} was not deleted: it still holds windows {gone & set(values)}"
        for start, published in values.items():
            # Each window's records are the ledger's, byte for byte (a window published again repeats them).
            stored = d.ledger.get(name, start)
            assert stored is not None and stored.published, (start, stored)
            assert published == {value for _, value in decode_entry(stored.payload).render()}, start
    finally:
        d.close()
