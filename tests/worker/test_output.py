"""Release records: schema-valid, only released groups, nothing un-noised."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import yaml

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.worker.app import build_runtimes
from stream_dp.worker.combiner import CombinedWindow
from stream_dp.worker.output import encode_releases

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())


def _runtime(groups: dict):
    data = yaml.safe_load((REPO / "deploy/queries.example.yaml").read_text())
    data["queries"][0]["groups"] = groups
    data["queries"][0]["epsilon"] = 1.0
    config = parse_config(data)
    return build_runtimes(config, secret=b"k" * 32, clock_ms=lambda: 0)[0]


def _window(groups, counts):
    counts = np.asarray(counts, dtype=np.int64)
    return CombinedWindow("pageviews_by_page", 60_000, 120_000, 0, groups, counts, counts * 7.0,
                          (counts + 1) // 2, [], 0, 0, None)


def test_public_groups_all_released_and_valid():
    runtime = _runtime({"public": ["/", "/pricing", "/docs"]})
    window = _window([("/",), ("/pricing",), ("/docs",)], [0, 40, 4000])
    noisy = runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise())
    records = encode_releases(runtime, window, noisy, 123_000)
    assert [k for k, _ in records] == [b'["/"]', b'["/pricing"]', b'["/docs"]']
    for key, value in records:
        record = orjson.loads(value)
        jsonschema.validate(record, SCHEMA)
        assert list(record["group"].values()) == orjson.loads(key)
        assert record["count"] >= 0 and record["privacy"]["epsilon"] <= 1.0
        assert record["window"]["start_ms"] == 60_000 and record["released_at_ms"] == 123_000
    assert len({orjson.loads(v)["release_id"] for _, v in records}) == 3


def test_selected_groups_only_kept_ones_and_exact_totals_never_appear():
    runtime = _runtime({"select": {"delta": 1e-6}})
    # One tiny group (2 units) never passes the threshold; a huge one always does.
    window = _window([("/rare",), ("/popular",)], [3, 200_000])
    noisy = runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise())
    records = [orjson.loads(v) for _, v in encode_releases(runtime, window, noisy, 0)]
    assert [r["group"]["page"] for r in records] == ["/popular"]
    (popular,) = records
    jsonschema.validate(popular, SCHEMA)
    assert popular["privacy"]["groups"] == "selected" and popular["privacy"]["delta"] > 0
    # The count is noisy: over a few releases it is not always the exact total.
    draws = {
        runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise()).count[1]
        for _ in range(5)
    }
    assert len(draws) > 1
