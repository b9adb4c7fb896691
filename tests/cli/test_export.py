"""``stream-dp export``: refused before connecting when its options or query file are wrong."""

from __future__ import annotations

from stream_dp.cli.main import main


def test_max_groups_and_lookback_must_be_positive(capsys):
    assert main(["export", "--config", "deploy/queries.example.yaml", "--max-groups", "0"]) == 2
    assert "--max-groups and --lookback must be 1 or more" in capsys.readouterr().err


def test_a_bad_query_file_is_named(tmp_path, capsys):
    bad = tmp_path / "queries.yaml"
    bad.write_text("queries: []\n")
    assert main(["export", "--config", str(bad)]) == 1
    assert str(bad) in capsys.readouterr().err
