"""Partials of a query with public groups name each group's position in the public list."""

from __future__ import annotations

import numpy as np

from stream_dp.windows import BoundingSpec, WindowEngine, WindowSpec
from stream_dp.windows.hashing import ContributionHasher
from stream_dp.windows.interning import GroupTable

from ._support import NOW_MS, SCHEMA, SECRET, FakeClock, batch_of, event

MIN = 60_000
W0 = NOW_MS - 5 * MIN
PUBLIC = [("/a",), ("/b",), ("/c",), ("/d",)]


def _engine(public_groups=PUBLIC) -> WindowEngine:
    engine = WindowEngine(
        SCHEMA, WindowSpec(size_ms=MIN, allowed_lateness_ms=0, idle_timeout_ms=30_000),
        BoundingSpec(max_groups_per_unit=10, max_events_per_group=10, clip_lo=0.0, clip_hi=10.0, secret=SECRET),
        clock_ms=FakeClock(), public_groups=public_groups,
    )
    engine.assign([0])
    return engine


def test_each_partial_names_its_groups_positions_in_the_public_list():
    engine = _engine()
    pages = ["/d", "/b", "/x", "/d", "/a"]  # /x is not public: its event is unlisted, never in a partial
    engine.process(batch_of([event(f"u{i}", W0 + i, page=p) for i, p in enumerate(pages)]))
    result = engine.process(batch_of([event("u9", W0 + MIN + 1, page="/c")], first_offset=len(pages)))
    (partial,) = result.partials
    assert sorted(partial.groups) == [("/a",), ("/b",), ("/d",)]
    assert partial.group_positions.dtype == np.int64
    assert partial.group_positions.tolist() == [PUBLIC.index(g) for g in partial.groups]
    totals = partial.aggregate()
    assert totals.positions.tolist() == [PUBLIC.index(g) for g in totals.groups]
    # a unit left out takes its groups out of the totals, and their positions with them
    excluded = np.array([unit == "u4" for unit in partial.units])
    kept = partial.aggregate(excluded)
    assert kept.positions.tolist() == [PUBLIC.index(g) for g in kept.groups] and ("/a",) not in kept.groups


def test_a_query_without_public_groups_names_no_positions():
    engine = _engine(public_groups=None)
    engine.process(batch_of([event("u1", W0, page="/a")]))
    (partial,) = engine.process(batch_of([event("u2", W0 + MIN + 1)], first_offset=1)).partials
    assert partial.group_positions is None and partial.aggregate().positions is None


def test_positions_follow_their_keys_when_the_table_forgets_keys():
    table = GroupTable(ContributionHasher(SECRET), public={"/a": 0, "/b": 1, "/c": 2})
    ids = table.ids_for(["/c", "/zz", "/a", "/b"] + [f"/n{i}" for i in range(100)])  # grows past its first arrays
    assert table.public_positions(ids[:4]).tolist() == [2, -1, 0, 1]
    remap = table.retain(ids[[0, 3]])  # /c and /b stay
    assert table.public_positions(remap[ids[[0, 3]]]).tolist() == [2, 1]
    again = table.ids_for(["/a", "/b"])
    assert table.public_positions(again).tolist() == [0, 1]
    assert GroupTable(ContributionHasher(SECRET)).public_positions(np.array([0])) is None


def test_groups_are_listed_in_the_public_lists_order_however_events_arrive():
    public = [("/z",), ("/a",), ("/m",)]  # not the order of their encodings
    pages = ["/m", "/a", "/z", "/a"]
    partials = []
    for order in (pages, pages[::-1]):
        engine = _engine(public_groups=public)
        engine.process(batch_of([event(f"u{i}", W0 + i, page=p) for i, p in enumerate(order)]))
        (partial,) = engine.process(batch_of([event("u9", W0 + MIN + 1, page="/z")], first_offset=4)).partials
        partials.append(partial)
    assert partials[0].groups == public and partials[0].group_positions.tolist() == [0, 1, 2]
    assert partials[0].groups == partials[1].groups
