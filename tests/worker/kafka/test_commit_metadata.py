"""The commit metadata a worker leaves for a partition's next owner: what it keeps, what it tolerates."""

from __future__ import annotations

import orjson

from stream_dp.worker.kafka.commit_metadata import (
    MAX_COMMITTED_STEPS,
    RestoredProgress,
    encode_commit_metadata,
    restored_progress,
)


def test_closure_steps_above_the_committed_closure_round_trip_per_query():
    text = encode_commit_metadata({"a": 120, "b": 60}, {"a": [(5, 60), (9, 180)], "b": [(7, 120)]}, 11, 999)
    assert restored_progress(text, "a") == RestoredProgress(120, 11, 999, ((9, 180),))  # 60 is durable already
    assert restored_progress(text, "b") == RestoredProgress(60, 11, 999, ((7, 120),))
    assert restored_progress(text, "c") == RestoredProgress(None, 11, 999, ())


def test_only_the_newest_steps_are_kept_so_the_metadata_stays_small():
    steps = [(i, 60 * (i + 1)) for i in range(40)]
    text = encode_commit_metadata({"a": 0}, {"a": steps}, 50, None)
    assert restored_progress(text, "a").closure_steps == tuple(steps[-MAX_COMMITTED_STEPS:])
    assert len(text) < 400


def test_metadata_of_older_workers_and_garbage_restore_what_they_can():
    old = orjson.dumps({"closed_through_ms": {"a": 60}, "next_offset": 3, "record_clock_ms": 70}).decode()
    assert restored_progress(old, "a") == RestoredProgress(60, 3, 70, ())
    for bad in ("", None, "{", "[]", '{"closure_steps": {"a": [[1]]}}', '{"closure_steps": {"a": 5}}',
                '{"closed_through_ms": {"a": true}, "closure_steps": {"a": [["x", 2]]}}'):
        restored = restored_progress(bad, "a")
        assert restored.closed_through_ms is None and restored.closure_steps == ()
