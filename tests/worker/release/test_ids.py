"""How release records name their window and group: stable ids, UTC times to the millisecond."""

from stream_dp.worker.release.ids import iso_utc, release_id


def test_release_id_is_stable_and_distinct():
    assert release_id("q", 0, ("/a",)) == release_id("q", 0, ("/a",))
    assert len({release_id("q", 0, ("/a",)), release_id("q", 60_000, ("/a",)), release_id("q", 0, ("/b",)), release_id("r", 0, ("/a",))}) == 4


def test_iso_utc():
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
