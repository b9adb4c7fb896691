"""With public groups, events of groups outside the list are set aside before bounding.

They are never released, so they must take none of a unit's ``max_groups_per_unit`` slots and charge no
unit that sent nothing else. Here 1,000 units each send events to the public group ``/a`` and to an
unlisted ``/zz`` under one slot per unit; 200 more send only ``/zz``. Bounding used to choose among both
groups by keyed hash: about half of the ``/a`` events were lost to ``/zz`` (which the release then
dropped) and all 1,200 units were charged. The reference is written from the README's bounding rule:
each unit keeps its listed groups (here only ``/a``, one slot) and at most ``max_events_per_group`` events
in each, so ``/a``'s count is the sum over units of ``min(events in /a, max_events_per_group)``.
"""

from __future__ import annotations

import numpy as np
import orjson

from stream_dp.config import parse_config
from stream_dp.windows import RawBatch
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.ingest.partials_out import partial_message

SECRET = b"test-secret-0123456789abcdef"
W0 = 1_704_067_200_000
UNITS = 1_000
ONLY_UNLISTED = 200
MAX_EVENTS = 2


def _query(group_by: list[str], public: list) -> dict:
    return {
        "name": "pages", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m", "allowed_lateness": "1s"}, "group_by": group_by, "groups": {"public": public},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": MAX_EVENTS},
        "aggregations": {"count": {}}, "epsilon": 1.0,
    }


def _run(query: dict, events: list[dict]) -> tuple[object, object, object]:
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
                           "queries": [query]})
    clock = [W0 + 1_000]
    (runtime,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: clock[0])
    engine = runtime.engine
    engine.assign([0])
    engine.set_partition_count(1)
    values = [orjson.dumps(e) for e in events]
    keys = [e["user_id"].encode() for e in events]
    n = len(values)
    result = engine.process(RawBatch(values, np.zeros(n), np.arange(n), np.full(n, W0 + 100), keys))
    clock[0] = W0 + 10 * 60_000
    (partial,) = engine.tick()
    totals = partial.aggregate()
    message = partial_message(runtime, partial, totals, input_partitions=1, units=len(partial.units), excluded=0,
                              closed_at_ms=clock[0])
    runtime.combiner.add_partial(message, clock[0])
    return result, partial, runtime.combiner.take(W0)


def test_unlisted_groups_take_no_slot_of_a_unit_and_charge_no_unit():
    rng = np.random.default_rng(5)
    events, listed_events = [], {}
    for unit in range(UNITS + ONLY_UNLISTED):
        n_a = 0 if unit >= UNITS else int(rng.integers(1, 4))
        n_zz = int(rng.integers(1, 4))
        listed_events[f"u{unit}"] = n_a
        for i in range(n_a):
            events.append({"user_id": f"u{unit}", "ts": W0 + 1 + i, "page": "/a"})
        for i in range(n_zz):
            events.append({"user_id": f"u{unit}", "ts": W0 + 10 + i, "page": "/zz"})
    rng.shuffle(events)
    result, partial, window = _run(_query(["page"], ["/a", "/b"]), events)
    reference = sum(min(n, MAX_EVENTS) for n in listed_events.values())
    counts = dict(zip([g[0] for g in window.groups], window.count.tolist()))
    assert counts == {"/a": reference, "/b": 0}
    # charged: exactly the units with an event in a listed group
    assert sorted(partial.units) == sorted(u for u, n in listed_events.items() if n)
    unlisted = sum(1 for e in events if e["page"] == "/zz")
    assert result.unlisted == unlisted and result.accepted == len(events) - unlisted and result.balanced


def test_a_group_of_several_fields_is_listed_only_as_a_whole_and_by_type():
    # ("r", 1) is listed; ("r", "1") -- a string, as "1" is not 1 in events -- and ("s", 1) are not
    events = [{"user_id": f"u{i}", "ts": W0 + 1, "region": "r", "page": 1} for i in range(5)]
    events += [{"user_id": f"u{i}", "ts": W0 + 2, "region": "r", "page": "1"} for i in range(5)]
    events += [{"user_id": f"u{i}", "ts": W0 + 3, "region": "s", "page": 1} for i in range(5)]
    result, _, window = _run(_query(["region", "page"], [["r", 1], ["s", "1"]]), events)
    assert dict(zip(window.groups, window.count.tolist())) == {("r", 1): 5, ("s", "1"): 0}
    assert result.unlisted == 10 and result.accepted == 5 and result.balanced
