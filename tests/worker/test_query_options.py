"""End to end on the real broker and Redis: top_k (over public and over selected groups), quantiles, hierarchy,
continual, staircase, mean_vector, covariance and sample_aggregate queries in one worker.

One input topic feeds twelve queries. The data is known exactly, so each
release is checked against values computed here from the README's semantics,
with bounds wide enough (4x a 95% half-width, or a gap of many noise scales)
that the whole test fails by chance with probability below 1e-3. Every record
must match the release schema.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import pytest
import redis
import yaml
from kafka import KafkaProducer
from scipy import stats

from stream_dp.budget import RedisBudgetStore, policy_from_config
from stream_dp.config import load_config
from stream_dp.windows.hashing import derive_key, siphash_reference
from tests.worker._support import PRODUCER_STAMPED, consume_all, free_port, page_query

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())
WINDOW_MS = 5_000
PERIOD_WINDOWS = 4
WINDOWS = 2 * PERIOD_WINDOWS  # two periods
UNITS = 40
# events per unit per window and page: "a" clearly the most popular, then "b", then "c"
PAGE_EVENTS = {"a": 3, "b": 2, "c": 1}
PLACES = {"a": ("FR", "IDF", "Paris"), "b": ("FR", "ARA", "Lyon"), "c": ("DE", "BE", "Berlin")}
MAX_WINDOWS_PER_UNIT = 2
CLIP_NORM = 8.0
SA_BLOCKS = 4
SA_MEDIAN_BLOCKS = 20
# check-config refuses a file whose sample_aggregate queries' blocks could, all timing out, take longer
# together than their shortest window (one worker releases them in turn): here 3 groups x (4 x 80 ms for
# the median, 4 x 80 ms for the crashing function, 20 x 50 ms for the blocks' median) = 4.92 s within the
# 5 s windows. A block of statistics.median takes a few ms (a fork of the loaded sandbox), and the crashing
# one ends its process well within its limit, so it still counts as crashed, not timed out.
SA_TIMEOUT = "80ms"
SA_MEDIAN_TIMEOUT = "50ms"
SECRET = "test-secret-0123456789abcdef"
RARE_TAG = "rare"


def _query(name: str, topic: str, output: str, namespace: str, publish_from_ms: int, **options) -> dict:
    # a backfill: public groups publish from its first window (the worker's first start is later)
    selected = "select" in options.get("groups", {})
    return page_query(name, topic, output, namespace, pages=PAGE_EVENTS, window="5s", release_timeout="30s",
                      publish_from_ms=None if selected else publish_from_ms, **options)


def _config(tmp_path: Path, topic: str, outputs: dict[str, str], namespace: str, tag: str,
            publish_from_ms: int) -> Path:
    config = {
        "namespaces": {namespace: {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]}},
        "queries": [
            # geometric: the name of the discrete Laplace noise counts already get (records say laplace)
            _query(f"{tag}_top", topic, outputs["top"], namespace, publish_from_ms, aggregations={"count": {}, "top_k": {"k": 2}},
                   epsilon=10.0, mechanism="geometric"),
            # no public list: top_k ranks the groups partition selection released. Grouped by `tag`, the page
            # but for unit u0, whose events all carry RARE_TAG: each page has 39 units, far above the threshold
            # of 15 the selection's epsilon 10 / 3 sets at L0 = 3, while RARE_TAG's one unit is released with
            # probability 1.3e-7 a window -- ranking the window's groups, not its released ones, counts it a candidate.
            _query(f"{tag}_topsel", topic, outputs["topsel"], namespace, publish_from_ms, group_by=["tag"],
                   groups={"select": {"delta": 1e-6}}, aggregations={"count": {}, "top_k": {"k": 2}}, epsilon=10.0),
            _query(f"{tag}_quantiles", topic, outputs["quantiles"], namespace, publish_from_ms, epsilon=10.0, aggregations={
                "count": {}, "quantiles": {"field": "value", "q": [0.5, 0.9], "bounds": [0, 100], "bins": 100}}),
            # value intervals: a noisy histogram of 10 bins takes half of the quantiles' share (10 / 2 / 2)
            _query(f"{tag}_qint", topic, outputs["qint"], namespace, publish_from_ms, epsilon=10.0, aggregations={
                "count": {}, "quantiles": {"field": "value", "q": [0.5], "bounds": [0, 100], "bins": 10,
                                           "value_interval": True}}),
            # quantiles over selected groups, at most the 2 with the largest noisy counts: pages a and b
            _query(f"{tag}_qcap", topic, outputs["qcap"], namespace, publish_from_ms, epsilon=10.0, groups={"select": {"delta": 1e-6}},
                   aggregations={"count": {}, "quantiles": {"field": "value", "q": [0.5], "bounds": [0, 100],
                                                            "bins": 100, "max_released_groups": 2}}),
            _query(f"{tag}_places", topic, outputs["places"], namespace, publish_from_ms, epsilon=10.0,
                   group_by=["country", "region", "city"], groups={"public": [list(p) for p in PLACES.values()]},
                   hierarchy={"split": [1, 1, 2]}, aggregations={"count": {}, "sum": {"field": "value", "clip": [0, 100]}}),
            _query(f"{tag}_today", topic, outputs["today"], namespace, publish_from_ms, epsilon=10.0,
                   continual={"period": f"{PERIOD_WINDOWS * WINDOW_MS // 1000}s",
                              "max_windows_per_unit": MAX_WINDOWS_PER_UNIT},
                   aggregations={"count": {}, "sum": {"field": "value", "clip": [0, 100]}}),
            _query(f"{tag}_stairs", topic, outputs["stairs"], namespace, publish_from_ms, epsilon=10.0, mechanism="staircase",
                   aggregations={"count": {}, "sum": {"field": "value", "clip": [0, 100]}, "mean": {"field": "value"}}),
            _query(f"{tag}_vec", topic, outputs["vec"], namespace, publish_from_ms, epsilon=10.0, mechanism="gaussian", delta=1e-5,
                   aggregations={"mean_vector": {"fields": ["vx", "vy"], "clip_norm": CLIP_NORM}}),
            _query(f"{tag}_cov", topic, outputs["cov"], namespace, publish_from_ms, epsilon=10.0, mechanism="gaussian", delta=1e-5,
                   aggregations={"count": {}, "covariance": {"fields": ["vx", "vy"], "clip_norm": CLIP_NORM}}),
            _query(f"{tag}_median", topic, outputs["median"], namespace, publish_from_ms, epsilon=10.0, aggregations={
                "sample_aggregate": {"function": "statistics:median", "field": "value", "blocks": SA_BLOCKS,
                                     "output_range": [0, 100], "timeout": SA_TIMEOUT}}),
            _query(f"{tag}_blockmedian", topic, outputs["blockmedian"], namespace, publish_from_ms, epsilon=10.0, aggregations={
                "sample_aggregate": {"function": "statistics:median", "field": "value", "blocks": SA_MEDIAN_BLOCKS,
                                     "output_range": [0, 100], "aggregate": "median", "bins": 20,
                                     "timeout": SA_MEDIAN_TIMEOUT}}),
            # a function that ends its process on any block holding a 7 (unit u2's first event, in every page)
            _query(f"{tag}_crashy", topic, outputs["crashy"], namespace, publish_from_ms, epsilon=10.0, aggregations={
                "sample_aggregate": {"function": "tests.worker._functions:exits_on_seven", "field": "value",
                                     "blocks": SA_BLOCKS, "output_range": [0, 100], "timeout": SA_TIMEOUT}}),
        ],
    }
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _vector(unit: int) -> tuple[float, float]:
    """Each unit's (vx, vy), the same in all its events: its mean vector in every page (norm < CLIP_NORM)."""
    return float(1 + unit % 5), float((unit * 7) % 11 - 5)


def _value(unit: int, event: int) -> float:
    """Values 1..UNITS*3 spread evenly: the median of a page's values is known."""
    return float(1 + (unit * 3 + event) % 90)


def _quiet_scrape(port: int, tries: int = 300) -> str:
    """A scrape during which no window was released.

    The client collects one metric family after another: a window released mid-scrape can show in the
    epsilon counter but not in the windows counter read just before it. Two scrapes with the same release
    counters mean nothing was released from the start of the first to the end of the second. (The empty
    windows since the data keep coming for a while on a loaded machine: up to a minute of tries.)
    """
    previous = None
    for _ in range(tries):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        released = re.findall(r"^stream_dp_(?:windows|epsilon)_released_total\{.*$", text, re.MULTILINE)
        if released == previous:
            return text
        previous = released
        time.sleep(0.2)
    raise AssertionError(f"windows kept being released over {tries} scrapes; the counters cannot be compared")


def test_options_release_what_the_readme_says(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name):
    topic = new_topic("in", partitions=2, configs=PRODUCER_STAMPED)
    outputs = {k: f"{unique_name}-{k}" for k in ("top", "topsel", "quantiles", "qint", "qcap", "places", "today", "stairs",
                                                  "vec", "cov", "median", "blockmedian", "crashy")}
    namespace = f"{unique_name}-users"
    period_ms = PERIOD_WINDOWS * WINDOW_MS
    first_start = (int(time.time() * 1000) - 180_000) // period_ms * period_ms
    config_path = _config(tmp_path, topic, outputs, namespace, unique_name.replace("-", "_")[-30:], first_start)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    values: dict[str, list[float]] = collections.defaultdict(list)  # per page, every event of one window
    for w in range(WINDOWS):
        for u in range(UNITS):
            for page, events in PAGE_EVENTS.items():
                country, region, city = PLACES[page]
                for e in range(events):
                    ts = first_start + w * WINDOW_MS + 50 * u + e
                    event = {"user_id": f"u{u}", "ts": ts, "page": page, "value": _value(u, e),
                             "country": country, "region": region, "city": city,
                             "vx": _vector(u)[0], "vy": _vector(u)[1], "tag": RARE_TAG if u == 0 else page}
                    if w == 0:
                        values[page].append(event["value"])
                    producer.send(topic, key=f"u{u}".encode(), value=orjson.dumps(event), timestamp_ms=ts)
    producer.flush()

    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
               STREAM_DP_CONTRIBUTION_SECRET=SECRET, STREAM_DP_METRICS_PORT=str(metrics_port := free_port()))
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                              env=env, stdout=subprocess.DEVNULL, stderr=log)
    starts = [first_start + w * WINDOW_MS for w in range(WINDOWS)]
    try:
        def windows_of(records, kind=None):
            return {orjson.loads(m.value)["window"]["start_ms"] for m in records
                    if kind is None or orjson.loads(m.value).get("kind") == kind}

        got = {}
        for key, topic_name in outputs.items():
            # a window's top_k record is published after its group records: wait for it, not for the first row,
            # then read on to the partitions' ends (its group records may sit on a partition not yet read)
            kind = "top_k" if key in ("top", "topsel") else None
            got[key] = [orjson.loads(m.value) for m in consume_all(
                kafka_bootstrap, topic_name, until=lambda rs: set(starts) <= windows_of(rs, kind), timeout_s=150,
                settle_s=1.0)]
            assert set(starts) <= {r["window"]["start_ms"] for r in got[key]}, f"{key}: missing windows; log {tmp_path}"
        metrics = _quiet_scrape(metrics_port)
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()

    validator = jsonschema.Draft202012Validator(SCHEMA)
    for key, records in got.items():
        for record in records:
            validator.validate(record)
        ids = collections.Counter(r["release_id"] for r in records)
        assert max(ids.values()) == 1, f"{key}: a release published twice"

    # top_k: one record per window; "a" (3 events per unit) is far ahead of "b" (2 per unit):
    # a gap of UNITS events = 40 against an exponential scale of k * Linf / epsilon_topk = 2 * 3 / 5 = 1.2.
    tops = [r for r in got["top"] if r.get("kind") == "top_k" and r["window"]["start_ms"] in starts]
    assert len(tops) == WINDOWS
    for record in tops:
        assert [t["group"]["page"] for t in record["top"]] == ["a", "b"], record
        assert record["privacy"]["mechanism"] == "permute_and_flip"
        assert record["privacy"]["epsilon"] <= record["privacy"]["window_epsilon"] + 1e-9
    # the counts beside it: discrete Laplace at L0 Linf / epsilon_count = 3 * 3 / 5
    counts = [r for r in got["top"] if r.get("kind") != "top_k" and r["window"]["start_ms"] in starts]
    assert len(counts) == len(PAGE_EVENTS) * WINDOWS
    for record in counts:
        assert record["privacy"]["mechanism"] == "laplace", record["privacy"]
        assert record["privacy"]["count_scale"] == pytest.approx(9 / 5, rel=1e-6)

    # top_k over selected groups: one record per window, ranking only the groups released in that window
    # (selection, count and top_k take 10 / 3 each: scale 2 * 3 / (10 / 3) = 1.8 against gaps of 39 events)
    selected = collections.defaultdict(list)
    for record in got["topsel"]:
        if record.get("kind") != "top_k":
            selected[record["window"]["start_ms"]].append(record)
    selected_tops = [r for r in got["topsel"] if r.get("kind") == "top_k" and r["window"]["start_ms"] in starts]
    assert sorted(r["window"]["start_ms"] for r in selected_tops) == starts
    for record in selected_tops:
        rows = selected[record["window"]["start_ms"]]
        assert {r["group"]["tag"] for r in rows} == set(PAGE_EVENTS), rows  # RARE_TAG is not released
        assert record["candidates"] == len(rows), (record, rows)
        tags = [t["group"]["tag"] for t in record["top"]]
        assert set(tags) <= {r["group"]["tag"] for r in rows} and [t["rank"] for t in record["top"]] == [1, 2]
        assert tags == ["a", "b"], record
        privacy = record["privacy"]
        assert privacy["groups"] == "selected" and privacy["delta"] == 0.0
        assert privacy["window_delta"] == rows[0]["privacy"]["delta"] and 0 < privacy["window_delta"] <= 1e-6
        assert privacy["window_epsilon"] == rows[0]["privacy"]["epsilon"]
        assert privacy["epsilon"] == pytest.approx(10 / 3, rel=1e-6)

    # quantiles over selected groups capped at 2: the pages of 120 and 80 kept events pass selection with page
    # c (40), whose noisy count (discrete Laplace of scale L0 Linf / (10 / 3) = 2.7) falls 40 events short
    qcap = collections.defaultdict(list)
    for record in got["qcap"]:
        qcap[record["window"]["start_ms"]].append(record["group"]["page"])
    for start in starts:
        assert sorted(qcap[start]) == ["a", "b"], (start, qcap[start])

    # quantiles: the stated rank_error r is the module's calibration (stream_dp/dp/quantiles.py): scale
    # 2 L0 Linf max(num, den - num) / (den eps_q) ranks, eps_q = 10 / 2 (count, quantiles) / 2 (q's), times
    # ln(bins / beta), beta = 0.05 - COUNT_BETA = 0.025 since the query counts; a larger r would make the
    # checks below easier to pass. q_interval is q -+ r / n_low with n_low the noisy count less its
    # half-width at 97.5%, which lies between the count and the count less twice its 95% half-width.
    bins, l0, linf = 100, 3, 3
    eps_q = 10.0 / 2 / 2
    stated = {q: 2 * l0 * linf * max(num, den - num) / (den * eps_q) * math.log(bins / 0.025)
              for q, (num, den) in ((0.5, (1, 2)), (0.9, (9, 10)))}
    # A draw misses when the released edge's true rank L (values below it; every window holds the values
    # of window 0) has |L - q n| > r, or L / n lies outside q_interval. The module's accuracy argument
    # (an edge beats the best one with probability at most exp(-gap / scale)), summed over the edges that
    # miss, bounds a correct draw's miss probability by 0.0025 on this data (page "c" cannot miss: n = 40
    # < r), so 3 misses among the 48 draws have probability below 2e-5 (the exact permute-and-flip law:
    # 2e-8). A uniformly random edge misses in 15-56% of the draws of pages "a" and "b" (11 expected, at
    # most 2 with probability 2e-4); always answering the lowest edge misses in all 32 of them.
    draws, misses = 0, []
    for record in got["quantiles"]:
        if record["window"]["start_ms"] not in starts:
            continue
        page_values = values[record["group"]["page"]]
        n = len(page_values)
        for q, r in stated.items():
            released = record["quantiles"][str(q)]
            assert released["rank_error"] == pytest.approx(r, rel=1e-6), record
            # the record states the exponential mechanism's scale that rank_error comes from
            stated_law = record["privacy"]["quantiles"]
            assert (stated_law["mechanism"], stated_law["bins"], stated_law["bounds"]) == ("exponential", bins, [0, 100])
            assert stated_law["epsilon_per_quantile"] == pytest.approx(eps_q, rel=1e-6)
            assert stated_law["scale"][stated_law["q"].index(q)] == pytest.approx(r / math.log(bins / 0.025), rel=1e-6)
            low, high = released["q_interval"]
            narrowest = r / max(1.0, record["count"])
            widest = r / max(1.0, record["count"] - 2 * record["ci95"]["count"])
            assert max(0.0, q - widest) - 1e-9 <= low <= max(0.0, q - narrowest) + 1e-9, record
            assert min(1.0, q + narrowest) - 1e-9 <= high <= min(1.0, q + widest) + 1e-9, record
            rank = sum(v < released["value"] for v in page_values)
            draws += 1
            if abs(rank - q * n) > r or not low <= rank / n <= high:
                misses.append((record["group"]["page"], q, released["value"], rank, n))
    assert draws == 2 * len(PAGE_EVENTS) * WINDOWS
    assert len(misses) <= 2, misses

    # value intervals: [lower, upper] are bin edges holding the page's true median (numpy's inverted_cdf of
    # every value of a window) with probability >= 95% by construction (stream_dp/dp/quantile_intervals.py;
    # tests/dp/test_quantile_intervals.py sees 99.9% on data of every shape): at most 1 miss among the 16
    # intervals of pages "a" and "b". With 120 and 80 values and the histogram's noise of scale
    # L0 Linf / 2.5 = 3.6 they are narrower than the whole range; "c"'s 40 values are too few to narrow it.
    narrowed, missed = 0, []
    for record in got["qint"]:
        if record["window"]["start_ms"] not in starts:
            continue
        page = record["group"]["page"]
        lower, upper = record["quantiles"]["0.5"]["value_ci95"]
        assert lower in [10.0 * i for i in range(11)] and upper in [10.0 * i for i in range(11)], record
        assert lower <= upper, record
        truth = float(np.quantile(values[page], 0.5, method="inverted_cdf"))
        if page != "c":
            narrowed += (lower, upper) != (0.0, 100.0)
            if not lower <= truth <= upper:
                missed.append((page, lower, upper, truth))
        law = record["privacy"]["quantiles"]["value_interval"]
        assert (law["kind"], law["confidence"]) == ("noisy_histogram", 0.95), record
        assert law["scale"] == pytest.approx(3 * 3 / 2.5, rel=1e-6), record
    assert len(missed) <= 1, missed
    assert narrowed >= 8, narrowed

    # hierarchy: every level present; children add up to their parent; values near the truth.
    window0 = [r for r in got["places"] if r["window"]["start_ms"] == starts[0]]
    by_level = collections.defaultdict(dict)
    for record in window0:
        by_level[record["level"]][tuple(record["group"].values())] = record
    assert sorted(by_level) == [0, 1, 2]
    assert set(by_level[0]) == {("FR",), ("DE",)}
    assert set(by_level[1]) == {("FR", "IDF"), ("FR", "ARA"), ("DE", "BE")}
    for level in (1, 2):
        for field in ("count", "sum"):  # both made consistent
            totals = collections.defaultdict(float)
            for key, record in by_level[level].items():
                totals[key[:-1]] += record[field]
            for parent, total in totals.items():
                assert total == pytest.approx(by_level[level - 1][parent][field], rel=1e-9, abs=1e-6), field
    for page, place in PLACES.items():
        true_count = UNITS * PAGE_EVENTS[page]
        assert abs(by_level[2][place]["count"] - true_count) <= 4 * by_level[2][place]["ci95"]["count"]
    # split [1, 1, 2] of the whole epsilon (counts and sums are the only release): 2.5, 2.5 and 5
    for level, share in ((0, 2.5), (1, 2.5)):
        for record in by_level[level].values():
            assert record["privacy"]["level_epsilon"] == pytest.approx(share, rel=1e-6), record["privacy"]

    # continual: running totals since the period's start; a unit counts in its first 2 windows of a period.
    per_window = {p: UNITS * n for p, n in PAGE_EVENTS.items()}
    for record in got["today"]:
        start = record["window"]["start_ms"]
        if start not in starts:
            continue
        t = (start - first_start) % period_ms // WINDOW_MS + 1
        assert record["continual"]["window_index"] == t
        assert record["continual"]["period_start_ms"] == first_start + (start - first_start) // period_ms * period_ms
        page = record["group"]["page"]
        true_count = per_window[page] * min(t, MAX_WINDOWS_PER_UNIT)
        assert abs(record["count"] - true_count) <= 4 * record["ci95"]["count"], (t, record)
        # the running sum too: every value is inside the clip [0, 100]
        true_sum = sum(_value(u, e) for u in range(UNITS) for e in range(PAGE_EVENTS[page])) * min(t, MAX_WINDOWS_PER_UNIT)
        assert abs(record["sum"] - true_sum) <= 4 * record["ci95"]["sum"], (t, record)
        assert record["privacy"]["charged"] == "per_period"
        # a tree over the period's 4 windows has nodes of 1, 2 and 4 windows: 3 levels share the 10
        tree = record["privacy"]["continual"]
        assert (tree["mechanism"], tree["depth"], tree["windows_per_period"]) == ("binary_tree", 3, PERIOD_WINDOWS)
        assert tree["max_windows_per_unit"] == MAX_WINDOWS_PER_UNIT
        assert tree["epsilon_per_level"] * 3 == pytest.approx(record["privacy"]["epsilon"], rel=1e-6)

    # staircase: the record states the law (epsilon per group = 5 / L0 for each of count and sum; stairs as
    # wide as one unit's move of a group); values within 4x the stated 95% half-width of the truth.
    for record in got["stairs"]:
        if record["window"]["start_ms"] not in starts:
            continue
        privacy = record["privacy"]
        assert privacy["mechanism"] == "staircase" and privacy["epsilon"] <= 10.0
        law = privacy["staircase"]
        assert law["count"]["epsilon_per_group"] * 3 <= 5.0 + 1e-12 and law["count"]["stair_width"] == 3
        assert law["sum"]["stair_width"] == pytest.approx(300, rel=1e-5) and law["sum"]["stair_width"] >= 300
        assert law["count"]["grid"] == 1 and 0 < law["sum"]["gamma"] < 0.5
        page = record["group"]["page"]
        assert abs(record["count"] - UNITS * PAGE_EVENTS[page]) <= 4 * record["ci95"]["count"], record
        true_sum = sum(_value(u, e) for u in range(UNITS) for e in range(PAGE_EVENTS[page]))
        assert abs(record["sum"] - true_sum) <= 4 * record["ci95"]["sum"], record

    # mean_vector: per page, every unit's vector once (L0 = 3 covers the three pages); sums and the unit
    # count within 5 noise sds (probability below 6e-7 each); the record states the Gaussian noise it drew.
    true_sum = np.array([_vector(u) for u in range(UNITS)]).sum(axis=0)
    for record in (r for r in got["vec"] if r["window"]["start_ms"] in starts):
        block, privacy = record["mean_vector"], record["privacy"]["mean_vector"]
        sd = privacy["noise_sd"]
        assert privacy["mechanism"] == "gaussian_vector" and block["sum_sd"] == sd
        # sigma = sqrt(L0 * 2) C / sqrt(2 rho), rho within the window's budget
        assert privacy["l2_sensitivity"] == pytest.approx(math.sqrt(3 * 2) * CLIP_NORM)
        assert privacy["l2_sensitivity"] ** 2 / (2 * sd**2) <= privacy["rho"] * (1 + 1e-9)
        assert np.all(np.abs(np.array(block["sum"]) - true_sum) <= 5 * sd), record
        assert abs(block["units"] - UNITS) <= 5 * sd / CLIP_NORM, record
        assert record["privacy"]["epsilon"] <= 10.0 + 1e-9 and record["privacy"]["delta"] <= 1e-5 * (1 + 1e-9)
    # covariance: PSD and symmetric whatever the noise. The true augmented matrix A = sum of x~ x~^T,
    # x~ = (vx, vy, C), every unit once per page, is PSD, and projecting onto the PSD cone is non-expansive
    # in the Frobenius norm, so the projection P is within the noise's Frobenius norm of A. The record
    # gives P back: P = [[n M, C n mu], [C n mu^T, C^2 n]] from its units n, mean mu and second moment M,
    # and its covariance is the Schur complement M - mu mu^T. The noise's squared norm is at most
    # 2 sigma^2 chi2_6 (six noisy entries, off-diagonal ones mirrored), sigma the stated entry_sd: per
    # record ||P - A|| <= 9 sigma (2 chi2_6 > 81: probability 4e-7), and over the R independent records
    # sum ||P - A||^2 <= 2 sigma^2 times chi2_6R's 1 - 1e-6 quantile. A correct release averages at most
    # 9 sigma^2 per record, under half that bound; a mean off by delta in one field adds 2 (C n delta)^2,
    # about 5.8 delta^2 sigma^2 per record here, so an error of 2 or more is caught.
    x_tilde = np.array([[*_vector(u), CLIP_NORM] for u in range(UNITS)])
    truth = x_tilde.T @ x_tilde
    cov_records = [r for r in got["cov"] if r["window"]["start_ms"] in starts]
    assert len(cov_records) == len(PAGE_EVENTS) * WINDOWS
    squared_errors = []
    for record in cov_records:
        block, privacy = record["covariance"], record["privacy"]["covariance"]
        sigma = block["entry_sd"]
        assert privacy["mechanism"] == "analyze_gauss" and block["psd_projected"] is True
        assert privacy["l2_sensitivity"] == pytest.approx(math.sqrt(3 * 3) * CLIP_NORM**2)
        assert sigma == privacy["noise_sd"]
        assert abs(block["units"] - UNITS) <= 9 * sigma / CLIP_NORM**2, record
        assert block["covariance"] is not None and block["fields"] == ["vx", "vy"], record  # units >= 13 here
        matrix, mean, second = (np.array(block[k]) for k in ("covariance", "mean", "second_moment"))
        assert matrix.shape == (2, 2)
        assert np.allclose(matrix, matrix.T) and np.linalg.eigvalsh(matrix).min() >= -1e-9
        assert np.allclose(matrix, second - np.outer(mean, mean), rtol=1e-9, atol=1e-9 * np.abs(second).max()), record
        n = block["units"]
        projected = np.block([[n * second, CLIP_NORM * n * mean[:, None]],
                              [CLIP_NORM * n * mean[None, :], np.array([[CLIP_NORM**2 * n]])]])
        squared_errors.append(float(np.sum((projected - truth) ** 2)) / sigma**2)
        assert squared_errors[-1] <= 81, (record, truth)
    assert sum(squared_errors) <= 2 * stats.chi2.isf(1e-6, 6 * len(cov_records)), squared_errors

    # sample_aggregate: the mean over blocks of each block's median, computed here from the README's
    # definition (block = ((h * 0x9E3779B97F4A7C15 mod 2^64) >> 32) mod blocks, h the keyed SipHash-1-3 of
    # the unit id, written with the pure-Python reference); within 4x the stated 95% half-width
    # (Laplace: probability e^-12 per record).
    unit_key = derive_key(SECRET.encode(), "stream-dp/units", 16)
    block = {u: ((siphash_reference(unit_key, f"u{u}".encode(), c_rounds=1, d_rounds=3) * 0x9E3779B97F4A7C15
                  % 2**64) >> 32) % SA_BLOCKS for u in range(UNITS)}
    for record in (r for r in got["median"] if r["window"]["start_ms"] in starts):
        page = record["group"]["page"]
        medians = []
        for b in range(SA_BLOCKS):
            members = [_value(u, e) for u in range(UNITS) if block[u] == b for e in range(PAGE_EVENTS[page])]
            medians.append(min(max(statistics.median(members), 0), 100) if members else 50.0)
        released = record["sample_aggregate"]
        assert released["blocks"] == SA_BLOCKS and record["privacy"]["sample_aggregate"]["function"] == "statistics:median"
        assert abs(released["value"] - sum(medians) / SA_BLOCKS) <= 4 * released["ci95"], (record, medians)

    # sample_aggregate with aggregate: median: the released edge's rank among the blocks' true outputs
    # (computed here as above) is within the stated rank_error of the middle, beyond the grid's own
    # resolution OPT; checked at twice rank_error (probability about beta^2 / bins per record).
    block20 = {u: ((siphash_reference(unit_key, f"u{u}".encode(), c_rounds=1, d_rounds=3) * 0x9E3779B97F4A7C15
                    % 2**64) >> 32) % SA_MEDIAN_BLOCKS for u in range(UNITS)}
    edges = np.linspace(0, 100, 21)
    median_records = [r for r in got["blockmedian"] if r["window"]["start_ms"] in starts]
    assert len(median_records) == len(PAGE_EVENTS) * WINDOWS
    for record in median_records:
        page = record["group"]["page"]
        outputs_ = []
        for b in range(SA_MEDIAN_BLOCKS):
            members = [_value(u, e) for u in range(UNITS) if block20[u] == b for e in range(PAGE_EVENTS[page])]
            outputs_.append(min(max(statistics.median(members), 0), 100) if members else 50.0)
        released, privacy = record["sample_aggregate"], record["privacy"]["sample_aggregate"]
        assert (privacy["aggregate"], privacy["noise"], privacy["bins"]) == ("median", "exponential", 20)
        assert released["value"] in edges.tolist() and released["blocks"] == SA_MEDIAN_BLOCKS
        error = released["rank_error"]
        assert released["q_interval"] == pytest.approx([max(0, 0.5 - error / 20), min(1, 0.5 + error / 20)])
        below = [sum(o < edge for o in outputs_) for edge in edges]
        opt = min(abs(b - SA_MEDIAN_BLOCKS / 2) for b in below)
        chosen = sum(o < released["value"] for o in outputs_)
        assert abs(chosen - SA_MEDIAN_BLOCKS / 2) <= opt + 2 * error, (record, sorted(outputs_))

    # a user function that kills its process costs its block, not the worker: every window is released
    # (checked above), and the failures are counted per reason
    crashed = sum(float(v) for q, v in re.findall(
        r'stream_dp_sample_aggregate_failed_blocks_total\{[^}]*query="([^"]+)"[^}]*reason="crashed"[^}]*\} (\S+)', metrics)
        if q.endswith("_crashy"))
    assert crashed >= len(PAGE_EVENTS) * WINDOWS, metrics[-2000:]
    # ... and reported for each window in the worker's log (one line per reason and window, counts only)
    reported = [m for line in (tmp_path / "worker.log").read_text().splitlines() if (m := re.search(
        r"window (\d+) of \S+_crashy: (\d+) block\(s\) failed \(crashed\) and count as the output range's midpoint$",
        line))]
    assert set(starts) <= {int(m.group(1)) for m in reported}, f"log {tmp_path}"

    # the epsilon metric counts a continual query once per period, the others once per window (windows of a
    # continual query are released in order from the first period's start; both series come from one scrape)
    def series(name: str, suffix: str) -> float:
        (value,) = [float(v) for q, v in re.findall(name + r'\{[^}]*query="([^"]+)"[^}]*\} (\S+)', metrics)
                    if q.endswith(suffix)]
        return value

    released_today = series("stream_dp_windows_released_total", "_today")
    assert released_today >= WINDOWS
    assert series("stream_dp_epsilon_released_total", "_today") == pytest.approx(
        10.0 * math.ceil(released_today / PERIOD_WINDOWS), rel=1e-6)
    assert series("stream_dp_epsilon_released_total", "_stairs") == pytest.approx(
        10.0 * series("stream_dp_windows_released_total", "_stairs"), rel=1e-6)

    # charged once per period: two periods, 10 epsilon each, plus the other eleven queries' windows
    store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy_from_config(load_config(config_path)))
    spends = {h.currency: h for h in store.spend(namespace, "u0", int(time.time() * 1000))}
    assert spends["epsilon"].spent == pytest.approx(2 * 10.0 + 12 * WINDOWS * 10.0, rel=1e-6)
    # delta: the two Gaussian vector queries' 1e-5 per window, and the selections' of the selected top_k and
    # the capped quantiles
    selection_delta = selected_tops[0]["privacy"]["window_delta"] + got["qcap"][0]["privacy"]["delta"]
    assert spends["delta"].spent == pytest.approx(WINDOWS * (2 * 1e-5 + selection_delta), rel=1e-6)
