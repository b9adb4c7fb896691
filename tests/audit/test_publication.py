"""The publication rule, as a property over generated queries and neighbouring streams, in process.

Whether and what a window publishes may depend on the configuration, DP outputs and clocks, never on the
data. For two streams that differ by one unit's events (D, and D' with a target unit), driven through the
window engine, the combiner and the release build (``publication.run``):

* with public groups, the set of published (window, kind, level, group) is the same for D and D';
* with selected groups, it is a function of the selection's noisy outcome alone: given the same outcome on
  both sides (a seeded one, ``publication.FixedSelection``; the target's groups absent from D fail it, as
  they do but with probability delta), it is the same for D and D'; and it is the one the documented
  semantics derive from that outcome: a record for each kept group (the ``max_released_groups`` with the
  largest noisy counts when more are kept), a top_k record exactly when a group is kept, nothing else.

Queries hold every option (counts, sums, means, top_k, quantiles with value intervals, vectors,
sample-and-aggregate, hierarchies, continual releases, local DP; every mechanism; window offsets; one or
two input partitions), clip bounds mostly not exact in binary, and values at, over and under them, NaN,
infinities, huge numbers and -0.0 (``publication.queries`` and ``publication.streams``).

EXAMPLES examples per test: about 30 s for both here (2 shared cores). Raise ``STREAM_DP_PUBLICATION_EXAMPLES``
for a longer search.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stream_dp.config.release_time import max_released_groups
from tests.audit.claims import claim_problems
from tests.audit.publication import T0, WINDOWS, Event, FixedSelection, pipeline_config, queries, run, seeded, streams

EXAMPLES = int(os.environ.get("STREAM_DP_PUBLICATION_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                  HealthCheck.data_too_large])


@st.composite
def cases(draw, selected: bool):
    query = draw(queries(selected))
    background, target = draw(streams(query))
    return query, background, target, draw(st.integers(1, 2))


def _difference(d, d_prime) -> str:
    return (f"published only in D: {sorted(d.keys() - d_prime.keys())}; only in D': "
            f"{sorted(d_prime.keys() - d.keys())}; windows whose release could not be built from their data "
            f"(released as if empty): {d.as_if_empty} in D, {d_prime.as_if_empty} in D'; not published at all: "
            f"{d.withheld} in D, {d_prime.withheld} in D'")


def _built_from_their_data(d, d_prime) -> None:
    # no input makes a release fail: a fallback hides a difference from the comparison, not from subscribers
    assert not (d.withheld or d_prime.withheld or d.as_if_empty or d_prime.as_if_empty), _difference(d, d_prime)


def _base(groups: dict, aggregations: dict) -> dict:
    return {"name": "q", "input_topic": "in", "output_topic": "out",
            "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "1s", "allowed_lateness": "500ms"}, "group_by": ["page"], "groups": groups,
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 10}, "epsilon": 1.0,
            "aggregations": aggregations}


# A value over a clip top not exact in binary, from a unit alone in its group: its exact sum was rounded above
# count x hi, and the window's release could not be built (it was withheld) -- only with the unit.
CLIP_TOP = (_base({"public": ["a", "b"]}, {"count": {}, "sum": {"field": "value", "clip": [0, 0.3]}}),
            [Event(f"u{i}", w, "a", b"0.1") for i in range(5) for w in range(3)],
            [Event("target", w, "b", b"0.9") for w in range(3)], 1)
# One unit's lone event over selected groups: a top_k record of no candidates, where its absence gave none.
LONE_TOP_K = (_base({"select": {"delta": 1e-6}}, {"count": {}, "top_k": {"k": 1}}), [],
              [Event("target", 1, "t1", b"1")], 1)


@SETTINGS
@given(cases(selected=False))
@example(CLIP_TOP)
def test_with_public_groups_neighbours_publish_the_same_windows_kinds_and_groups(case):
    query, background, target, partitions = case
    d = run(query, background, partitions)
    d_prime = run(query, background + target, partitions)
    assert d.keys() == d_prime.keys(), _difference(d, d_prime)
    _built_from_their_data(d, d_prime)
    _check_claims(query, d, d_prime)
    # public groups publish every window from the query's first on, with data or without
    offset = pipeline_config(query).queries[0].window.offset_ms
    assert {start for start, *_ in d.keys()} >= {T0 + offset + w * 1000 for w in range(WINDOWS)}


@SETTINGS
@given(cases(selected=True), st.integers(0, 2**32 - 1))
@example(LONE_TOP_K, 0)
@example((CLIP_TOP[0] | {"groups": {"select": {"delta": 1e-6}}}, *CLIP_TOP[1:]), 0)
def test_with_selected_groups_what_is_published_is_a_function_of_the_selection_alone(case, seed):
    query, background, target, partitions = case
    decide = seeded(seed)
    on_d = FixedSelection(decide)
    d = run(query, background, partitions, on_d)
    # D' gets the same outcome: a group D's window did not offer (the target's alone) is not kept
    on_d_prime = FixedSelection(lambda start, group: group in on_d.offered.get(start, set()) and decide(start, group))
    d_prime = run(query, background + target, partitions, on_d_prime)
    # the same outcome indeed: D' draws every window D draws, and windows of the target alone (nothing kept)
    assert on_d.kept.keys() <= on_d_prime.kept.keys()
    assert all(kept == on_d.kept.get(start, set()) for start, kept in on_d_prime.kept.items())
    _built_from_their_data(d, d_prime)
    _check_claims(query, d, d_prime)
    cap = max_released_groups(pipeline_config(query).queries[0])
    for label, published, selection in (("D", d, on_d), ("D'", d_prime, on_d_prime)):
        _check_against_the_outcome(label, published, selection.kept, cap, query)
    assert _outcome_view(d, cap) == _outcome_view(d_prime, cap), _difference(d, d_prime)


def _check_claims(query: dict, *published) -> None:
    """Every record states the epsilon, delta and mechanism its query configures (``claims``)."""
    problems = [p for side in published for record in side.records for p in claim_problems(record, query)]
    assert not problems, problems[:5]


def _group(record: dict) -> tuple:
    return tuple(record["group"][name] for name in ("page",))


def _check_against_the_outcome(label: str, published, kept: dict[int, set[tuple]], cap: int | None, query: dict):
    """The records the documented semantics derive from the kept groups of each window, and none other."""
    by_window: dict[int, list[dict]] = {}
    for record in published.records:
        by_window.setdefault(record["window"]["start_ms"], []).append(record)
    assert set(by_window) <= {start for start, groups in kept.items() if groups}, (
        f"{label}: records of windows in which no group was kept: "
        f"{ {s: by_window[s] for s in set(by_window) - {s for s, g in kept.items() if g}} }")
    for start, groups in kept.items():
        records = by_window.get(start, [])
        rows = [r for r in records if "kind" not in r]
        tops = [r for r in records if r.get("kind") == "top_k"]
        assert len(rows) + len(tops) == len(records), f"{label}: unexpected kinds {records}"
        released = {_group(r) for r in rows}
        assert len(released) == len(rows), f"{label}: a group published twice in window {start}"
        if cap is None or len(groups) <= cap:
            assert released == groups, f"{label} window {start}: released {released}, kept {groups}"
        else:  # the cap's choice among them (the largest noisy counts) is checked in tests/worker/release/test_build.py
            assert released <= groups and len(released) == cap, (label, start, released, groups, cap)
        top_k = "top_k" in query["aggregations"]
        assert len(tops) == (1 if top_k and groups else 0), f"{label} window {start}: {tops} with kept {groups}"
        for top in tops:
            assert top["candidates"] == len(released)
            assert {_group(t) for t in top["top"]} <= released


def _outcome_view(published, cap: int | None) -> set[tuple]:
    """What must be equal between neighbours given one selection outcome: every (window, kind, group), but
    when the cap applies only how many groups a window releases (which of the kept ones reads noisy counts)."""
    if cap is None:
        return published.keys()
    rows: dict[int, int] = {}
    out = set()
    for record in published.records:
        start = record["window"]["start_ms"]
        if "kind" in record:
            out.add((start, record["kind"]))
        else:
            rows[start] = rows.get(start, 0) + 1
    return out | {(start, "group", n) for start, n in rows.items()}
