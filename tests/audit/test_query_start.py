"""One unit alone in an early window must not decide which windows a public-groups query publishes.

Neighbouring live streams through real worker processes (``live_pair``). Both workers are running before
the first window below opens. In D nobody sends anything in windows 0 and 1, and 20 units send to
``/a`` in windows 2 and 3; D' adds one unit alone in window 0. Every window from the query's start on
is published, data or not, so both streams must publish the same (window, kind, group) records for
windows 0 to 3. When the query's first published window was its oldest window with data, D published
windows 2 and 3 only and D' windows 0 to 3: the target's one event was visible without noise.
"""

from __future__ import annotations

import pytest

from tests.audit.live_pair import LivePair, release_key

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

WINDOWS = 4
WINDOW_MS = 2_000
BACKGROUND = 20
FIRST_DATA = 2  # the first window with data in both streams

QUERY = {
    "timestamp_field": "ts",
    "window": {"size": "2s", "allowed_lateness": "500ms", "idle_timeout": "2s"},
    "group_by": ["page"], "groups": {"public": ["/a", "/b"]},
    "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
    "aggregations": {"count": {}},
    "epsilon": 1.0,
    "release_timeout": "30s",
}


def _events(w: int, with_target: bool):
    if w >= FIRST_DATA:
        return [(f"u{w}-{i}", 100 + i, {"page": "/a"}) for i in range(BACKGROUND)]
    return [("target", 300, {"page": "/b"})] if with_target and w == 0 else []


def test_one_unit_alone_in_an_early_window_does_not_move_the_first_published_window(
        tmp_path, kafka_bootstrap, redis_url):
    with LivePair(tmp_path, kafka_bootstrap, redis_url, QUERY) as pair:
        pair.produce(WINDOWS, WINDOW_MS, _events)
        pair.collect()
        lo, hi = pair.data_windows[0], pair.data_windows[-1]  # windows 0 to 3, data or not

        def published(label: str) -> set[tuple[int, str, str]]:
            return {release_key(r) for r in pair.streams[label].records if lo <= r["window"]["start_ms"] <= hi}

        d, d_prime = published("D"), published("D'")
        expected = {(start, "group", f'{{"page":"{page}"}}') for start in pair.data_windows for page in ("/a", "/b")}
        windows = {label: sorted({(w - lo) // WINDOW_MS for w, _, _ in p}) for label, p in (("D", d), ("D'", d_prime))}
        print(f"windows published of 0..{WINDOWS - 1}: {windows}")
        in_d, in_d_prime = windows["D"], windows["D'"]
        assert d_prime == d, (f"D published windows {in_d}, D' (D and one unit alone in window 0) {in_d_prime}\n"
                              f"{pair.log_tails()}")
        assert d == expected, (f"D published {sorted(d)}, expected every public group of windows 0..3\n"
                               f"{pair.log_tails()}")
