"""The checks' own decoders (``evidence``, written from the wire formats page) read what the worker writes.

Each is run on records the production encoders made -- partials of every group-column layout, cut into
chunks; a release-ledger entry; budget states a real Redis holds after real charges -- and must read
back exactly what went in. Where both read a record (partials, ledger entries) the production decoder
is run too: the two agreeing on the worker's own bytes is what lets the checks use only the former.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import numpy as np
import orjson
import pytest

from stream_dp.worker.partials.wire import PartialAggregate, partial_records
from tests.reliability.evidence import (
    EvidenceError,
    canonical,
    ledger_records,
    read_frame,
    read_partials,
    release_id,
    spends,
)
from tests.reliability.services import PrivateRedis
from tests.reliability.topics import TopicRecord

GROUPS = {  # row i's group key
    "strings": lambda i: (f"page-{i}-ünï",),
    "strings holding NUL": lambda i: (f"a\x00{i}" if i % 3 else "",),
    "integers": lambda i: (i * 7_919 - 2**40,),
    "mixed, two fields": lambda i: (f"x{i}" if i % 2 else i, -i if i % 3 else f"y{i}"),
}


def _partial(layout: str, n: int = 3_000, sums: bool = True) -> PartialAggregate:
    rng = np.random.default_rng(7)  # synthetic data only
    return PartialAggregate(
        query="q", window_start_ms=4_000, window_end_ms=6_000, partition=1, input_partitions=3,
        groups=[GROUPS[layout](i) for i in range(n)], count=rng.integers(0, 10**9, n),
        sum=rng.normal(0, 1e6, n) if sums else None, distinct_units=rng.integers(0, 10**6, n),
        units_charged=9, units_excluded=2, closed_at_ms=7_000)


@pytest.mark.parametrize("layout", sorted(GROUPS))
def test_partials_of_every_group_layout_read_back_exactly(layout):
    partial = _partial(layout, sums=layout != "integers")  # large enough for several chunks
    chunks = partial_records(partial, 5_120)
    assert len(chunks) > 1
    records = [TopicRecord(0, i, None, value, {}, 100 + i) for i, value in enumerate(chunks)]
    (copy,), errors = read_partials(records)
    assert errors == []
    got = copy.partial
    assert got.groups == partial.groups and got.count == partial.count.tolist()
    assert got.sum == (partial.sum.tolist() if partial.sum is not None else None)
    assert got.distinct_units == partial.distinct_units.tolist()
    assert got.public_positions is None  # a partial of no public groups has none
    assert (got.query, got.window_start_ms, got.window_end_ms, got.partition, got.input_partitions,
            got.units_charged, got.units_excluded) == ("q", 4_000, 6_000, 1, 3, 9, 2)
    assert (copy.offset, copy.timestamp) == (len(chunks) - 1, 100 + len(chunks) - 1)  # stamped by its last chunk


def test_a_partials_public_positions_read_back_exactly():
    partial = _partial("strings", n=50)
    positions = np.array([-1 if i % 7 == 0 else 49 - i for i in range(50)], dtype=np.int64)
    partial = PartialAggregate(**{**partial.__dict__, "public_positions": positions})
    records = [TopicRecord(0, i, None, value, {}, 100 + i) for i, value in enumerate(partial_records(partial, 5_120))]
    (copy,), errors = read_partials(records)
    assert errors == [] and copy.partial.public_positions == positions.tolist()


def test_an_incomplete_or_altered_partial_is_not_read_as_whole():
    chunks = partial_records(_partial("strings"), 5_120)
    records = [TopicRecord(0, i, None, v, {}) for i, v in enumerate(chunks)]
    assert read_partials(records[:-1]) == ([], [])  # its writer stopped mid-way: nothing whole
    last = records[-1]
    altered = TopicRecord(0, last.offset, None, last.value[:-1] + bytes([last.value[-1] ^ 1]), {})
    whole, errors = read_partials(records[:-1] + [altered])
    assert whole == [] and len(errors) == 1 and "digest" in errors[0]
    with pytest.raises(EvidenceError):
        read_frame(b"\x00SDP\x63F\x00\x00\x00\x00")  # wire version 99


def test_a_ledger_entry_reads_as_the_records_the_worker_renders_from_it():
    from stream_dp.worker.release.entry import ReleaseEntry, decode_entry, encode_entry

    entry = ReleaseEntry(
        query="q_free", window_start_ms=8_000, group_names=["page", "n"], groups=[["home", "a\x00b"], [1, -2]], rows=2,
        values={"count": np.array([3.5, 0.0]), "sum": np.array([10.25, float("nan")]), "mean": b"null",
                "mean_ci": b"null"},
        prefix=b'{"query":"q_free","window":{"start":"x","end":"y","start_ms":8000,"end_ms":10000}',
        ci=(b"3.1", b"30.5"),
        tail=b'"std":{"count":1.0,"sum":2.0},"privacy":{"epsilon":1.0},"released_at_ms":5,"released_at":"z"}')
    payload = encode_entry(entry)
    rendered = [orjson.loads(value) for _, value in decode_entry(payload).render()]
    mine = ledger_records(payload)
    assert {canonical(r) for r in mine} == {canonical(r) for r in rendered}
    assert mine[0]["release_id"] == release_id("q_free", 8_000, ("home", 1))
    assert mine[1]["sum"] is None and mine[1]["group"] == {"page": "a\x00b", "n": -2}
    top = orjson.dumps({"query": "q_free", "kind": "top_k", "top": [{"rank": 1, "group": {"page": "home", "n": 1}}]})
    with_extra = encode_entry(replace(entry, extras=((b'["top_k"]', top),)))
    rendered = [orjson.loads(value) for _, value in decode_entry(with_extra).render()]
    assert [canonical(r) for r in ledger_records(with_extra)] == [canonical(r) for r in rendered]
    assert ledger_records(with_extra)[-1]["kind"] == "top_k"


@pytest.mark.services
def test_budget_states_read_back_as_the_spend_the_store_reports(tmp_path):
    from stream_dp.budget import RedisBudgetStore
    from stream_dp.budget.policy import BudgetPolicy, HorizonLimit, NamespacePolicy

    namespace = f"ev-{uuid.uuid4().hex[:10]}"
    policy = BudgetPolicy([NamespacePolicy(namespace, "epsilon", [
        HorizonLimit(3_600_000, 5.0, 2), HorizonLimit(3_600_000, 1e-6, 2, delta=True),
        HorizonLimit(86_400_000, 9.0, 2)])])
    server = PrivateRedis(tmp_path / "redis")  # its own keyspace: the decoder scans every state hash
    server.start()
    client = server.client()
    store = RedisBudgetStore(client, policy)
    now = int(time.time() * 1000) - 60_000  # event times the store clock (Redis TIME) accepts
    units = [f"u{i}" for i in range(40)] + ["ünï", "a:b"]
    try:
        for k in range(4):
            store.charge(namespace, f"c/{k}", units[: 10 + 10 * k], 1.25, now + k * 2_000)
        stored = spends(client, "dp:", namespace, 3)
        for unit in units:
            spent = [h.spent for h in store.spend(namespace, unit, now + 10_000)]
            assert [x / 1e6 for x in stored.get(unit, [0, 0, 0])[::2]] == pytest.approx(spent[::2]), unit
        assert stored["u0"][0] == 4 * 1_250_000 and stored["u35"][0] == 1_250_000
    finally:
        client.close()
        server.stop()
