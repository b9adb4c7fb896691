"""The top_k record of a query whose groups come from partition selection (``groups: {select: ...}``).

No public list: the candidates are the groups the selection released in the
same window, so the list reveals nothing beyond the rows already published.
The groups left out here hold the most events (one unit with
``max_events_per_group`` events each) and outnumber the released ones, so a
top_k that ranked every group of the window would list one of them in
almost every draw; the released groups are certain to pass selection (30 to
50 units against a threshold of 8).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import numpy as np
import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.release.build import _top_k_record, build_release

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "deploy/schemas/release.schema.json").read_text())
LINF = 1_000
# (page, distinct units, events): the "kept_*" groups pass selection, the "gone_*" ones do not (one
# unit or none: each kept with probability 7e-10 at this epsilon and delta), yet hold the most events
GROUPS = [("kept_a", 50, 50), ("kept_b", 40, 40), ("kept_c", 30, 30), ("gone_empty", 0, 0),
          *((f"gone_{i}", 1, LINF) for i in range(10))]
KEPT = {page for page, _, _ in GROUPS if page.startswith("kept")}


def _runtime():
    config = parse_config({
        "namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]}},
        "queries": [{
            "name": "top_selected", "input_topic": "in", "output_topic": "out",
            "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "5s"}, "group_by": ["page"], "groups": {"select": {"delta": 1e-9}},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": LINF},
            # selection, count and top_k take 3 each: top_k's scale is k Linf / 3 = 667 events; ranking
            # all 14 groups, the first pick would be one of the ten 1,000-event groups with probability
            # 0.92 and both picks released groups with probability 0.004 (20,000 draws of this noise)
            "aggregations": {"count": {}, "top_k": {"k": 2}}, "epsilon": 9.0,
        }],
    })
    (runtime,) = build_runtimes(config, secret=b"test-secret-0123456789abcdef", clock_ms=lambda: 0)
    return runtime


def _window():
    return SimpleNamespace(
        query="top_selected", window_start_ms=60_000, window_end_ms=65_000,
        groups=[(page,) for page, _, _ in GROUPS],
        count=np.array([events for _, _, events in GROUPS], dtype=np.int64),
        distinct_units=np.array([units for _, units, _ in GROUPS], dtype=np.int64),
        sum=None, histogram=None, features=None, blocks=None, withheld=None,
    )


def test_top_k_of_selected_groups_ranks_only_the_released_ones():
    runtime = _runtime()
    assert runtime.plan.top_k.scale == pytest.approx(2 * LINF / 3, rel=1e-6)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    noise = OpenDPNoise()
    for _ in range(10):  # a wrong candidate set would show in the first draw; more draws vary the ranking
        records = [orjson.loads(value) for _, value in build_release(runtime, _window(), noise, 70_000).render()]
        for record in records:
            validator.validate(record)
        rows = [r for r in records if r.get("kind") != "top_k"]
        (top,) = [r for r in records if r.get("kind") == "top_k"]
        assert {r["group"]["page"] for r in rows} == KEPT
        assert top["candidates"] == len(rows) == len(KEPT)
        assert [t["rank"] for t in top["top"]] == [1, 2] and top["k"] == 2
        pages = [t["group"]["page"] for t in top["top"]]
        assert set(pages) <= KEPT and len(set(pages)) == 2, top
        # what the list spent, beside what the whole window spent (the rows' statement)
        privacy, window = top["privacy"], rows[0]["privacy"]
        assert privacy["mechanism"] == "permute_and_flip" and privacy["groups"] == window["groups"] == "selected"
        assert privacy["window_delta"] == window["delta"] and 0 < window["delta"] <= 1e-9  # the selection's
        assert privacy["window_epsilon"] == window["epsilon"] == pytest.approx(9.0, rel=1e-6)
        assert privacy["epsilon"] == pytest.approx(3.0, rel=1e-6)
        assert privacy["delta"] == 0.0 and privacy["rho"] == pytest.approx(privacy["epsilon"] ** 2 / 2)
        assert privacy["top_k_scale"] == runtime.plan.top_k.scale
        assert privacy["count_scale"] is None and privacy["sum_scale"] is None
        for name in ("namespace", "unit_field", "max_groups_per_unit", "max_events_per_group"):
            assert privacy[name] == window[name], name


def test_top_k_record_draws_from_the_given_candidates_only():
    # the candidate positions as build_release passes them: the selection's kept groups, here fixed
    runtime = _runtime()
    keep = np.array([page.startswith("kept") for page, _, _ in GROUPS])
    index = np.flatnonzero(keep)
    noise = OpenDPNoise()
    for _ in range(10):
        _, value = _top_k_record(runtime, _window(), SimpleNamespace(keep=keep), index, noise, 70_000)
        record = orjson.loads(value)
        jsonschema.Draft202012Validator(SCHEMA).validate(record)
        assert record["candidates"] == 3
        assert {t["group"]["page"] for t in record["top"]} <= KEPT, record


def test_a_window_whose_selection_released_no_group_publishes_no_top_k_record():
    # Only the groups the selection drops (one unit or none): nothing is released, as for a window without
    # data, which is never drawn. A list of no candidates would tell that the window had data.
    runtime = _runtime()
    gone = [i for i, (page, _, _) in enumerate(GROUPS) if page.startswith("gone")]
    window = _window()
    window = SimpleNamespace(**{**vars(window), "groups": [window.groups[i] for i in gone],
                                "count": window.count[gone], "distinct_units": window.distinct_units[gone]})
    for _ in range(10):
        assert build_release(runtime, window, OpenDPNoise(), 70_000).render() == []
