"""A value at the top of a clip range not exact in binary must not decide whether a window is published.

Neighbouring live streams through real worker processes (``live_pair``): in D, 50 units send one event
of value 0.1 to the public group ``/a`` in every window; D' adds, in every window, one unit alone in
``/b`` with one event of value 0.9, clipped to 0.3. A unit's clipped sum of 0.3 used to be put on the
exact-sum grid just above ``count x 0.3``; the release's range check then refused the window, and
D' published none of the windows D published.
"""

from __future__ import annotations

import pytest

from tests.audit.live_pair import LivePair

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

WINDOWS = 4
WINDOW_MS = 2_000
BACKGROUND = 50

QUERY = {
    "timestamp_field": "ts",
    "window": {"size": "2s", "allowed_lateness": "500ms", "idle_timeout": "2s"},
    "group_by": ["page"], "groups": {"public": ["/a", "/b"]},
    "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 10},
    "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 0.3]}},
    "epsilon": 1.0,
    "release_timeout": "30s",
}


def _events(w: int, with_target: bool):
    events = [(f"u{w}-{i}", 100 + i, {"page": "/a", "value": 0.1}) for i in range(BACKGROUND)]
    if with_target:
        events.append((f"target-{w}", 300, {"page": "/b", "value": 0.9}))
    return events


def test_a_value_at_the_clip_top_publishes_the_same_windows(tmp_path, kafka_bootstrap, redis_url):
    with LivePair(tmp_path, kafka_bootstrap, redis_url, QUERY) as pair:
        pair.produce(WINDOWS, WINDOW_MS, _events)
        pair.collect()
        d, d_prime = pair.published("D"), pair.published("D'")
        expected = {(start, "group", f'{{"page":"{page}"}}') for start in pair.data_windows for page in ("/a", "/b")}
        assert d == expected, f"D published {sorted(d)}, expected every public group of every window\n{pair.log_tails()}"
        assert d_prime == d, (f"D' published {len(d_prime)} of the {len(d)} (window, group) records D published: "
                              f"missing {sorted(d - d_prime)}\n{pair.log_tails()}")
        # and with their data: neither stream fell back to a release as if empty
        fallbacks = [r for s in pair.streams.values() for r in s.records if r.get("as_if_empty")]
        assert not fallbacks, f"released as if empty: {fallbacks[:2]}"
