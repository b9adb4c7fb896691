"""``stream-dp check-config`` accepts exactly the query files ``stream-dp run`` can start with.

The corpus (tests/config/corpus) holds good and bad files; each states its verdict in its first
lines: ``# expect: ok``, or one ``# rejected: LOCATION: REGEX`` per problem check-config must list.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stream_dp.cli.main import main
from stream_dp.worker.app import Worker
from tests.config.test_implied import written_out

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "queries.example.yaml"
CORPUS = sorted((ROOT / "tests" / "config" / "corpus").glob("*.yaml"))
RETENTION_ENV = "STREAM_DP_INPUT_RETENTION_MS"
HOUR_MS = 3_600_000


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker needs from the environment; nothing listens at the Redis URL, as the test stops
    the worker before it would use a connection."""
    monkeypatch.setenv("STREAM_DP_CONTRIBUTION_SECRET", "0123456789abcdef" * 4)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("STREAM_DP_REDIS_RETRIES", "0")
    monkeypatch.delenv(RETENTION_ENV, raising=False)


def run_until_kafka(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int | None, Exception | None]:
    """``stream-dp run --config path``, stopped where the worker would start talking to Kafka.

    Returns the exit status, or the exception that escaped ``run`` (a file the worker could not
    build used to end ``run`` with a traceback).
    """

    async def stop_before_kafka(worker: Worker) -> None:
        worker.budget.close()
        if worker._redis is not None:
            worker._redis.close()

    monkeypatch.setattr(Worker, "run", stop_before_kafka)
    try:
        return main(["run", "--config", str(path)]), None
    except Exception as error:
        return None, error


def verdict(path: Path) -> list[tuple[str, str]] | None:
    """The file's declared rejections as (location, message regex), or None for ``# expect: ok``."""
    rejections = []
    for line in path.read_text().splitlines():
        if line == "# expect: ok":
            return None
        if line.startswith("# rejected: "):
            location, pattern = line.removeprefix("# rejected: ").split(": ", 1)
            rejections.append((location, pattern))
    assert rejections, f"{path.name} declares no verdict: start it with '# expect: ok' or '# rejected: ...'"
    return rejections


def test_the_corpus_holds_both_verdicts():
    verdicts = [verdict(path) for path in CORPUS]
    assert sum(v is None for v in verdicts) >= 3 and sum(v is not None for v in verdicts) >= 10


@pytest.mark.parametrize("path", [EXAMPLE, *CORPUS], ids=lambda path: path.stem)
def test_check_config_accepts_exactly_what_run_starts_with(path, worker_env, monkeypatch, capsys):
    checked = main(["check-config", str(path)])
    problems = capsys.readouterr().err.splitlines()
    status, crash = run_until_kafka(path, monkeypatch)
    run_errors = capsys.readouterr().err
    if checked == 0:
        assert status == 0, f"check-config accepted {path.name}, but run refused it: {crash or run_errors}"
        return
    assert checked == 1
    assert crash is None, f"run crashed on {path.name} instead of explaining: {crash!r}"
    assert status == 1, f"check-config refused {path.name}, but run started with it"
    assert problems and all(line.startswith(f"{path}: ") for line in problems)
    for line in problems:  # one shared build: run lists the same problems in the same words
        assert line in run_errors


@pytest.mark.parametrize("path", CORPUS, ids=lambda path: path.stem)
def test_check_config_names_file_place_and_fix_of_each_problem(path, monkeypatch, capsys):
    monkeypatch.delenv(RETENTION_ENV, raising=False)
    status = main(["check-config", str(path)])
    out = capsys.readouterr()
    rejections = verdict(path)
    if rejections is None:
        assert status == 0 and f"{path}: OK" in out.out, out.err
        return
    assert status == 1 and "OK" not in out.out
    lines = out.err.splitlines()
    assert len(lines) == len(rejections), out.err
    for location, pattern in rejections:
        prefix = f"{path}: {location}: "
        assert any(
            line.startswith(prefix) and re.search(pattern, line.removeprefix(prefix)) for line in lines
        ), f"no line {prefix}/{pattern}/ in:\n{out.err}"


def test_the_limit_of_issue_13_is_reported_by_the_command():
    path = ROOT / "tests" / "config" / "corpus" / "bad_limit_above_ledger_range.yaml"
    env = {name: value for name, value in os.environ.items() if name != RETENTION_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", "check-config", str(path)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(f"{path}: namespaces.users.budgets[1].epsilon: limit 1e+06 is above 4294.97")
    assert "lower it" in done.stderr


def test_bucket_layout_is_checked_for_the_workers_input_retention(worker_env, monkeypatch, capsys):
    # One-minute buckets fit a unit's state when the input topics keep an hour, not a week.
    path = ROOT / "tests" / "config" / "corpus" / "bad_buckets_too_fine_for_retention.yaml"
    assert main(["check-config", str(path), "--input-retention-ms", str(HOUR_MS)]) == 0
    assert "checked for an input retention of 1h" in capsys.readouterr().out
    assert main(["check-config", str(path), "--input-retention-ms", str(7 * 24 * HOUR_MS)]) == 1
    monkeypatch.setenv(RETENTION_ENV, str(HOUR_MS))
    assert main(["check-config", str(path)]) == 0
    assert run_until_kafka(path, monkeypatch) == (0, None)
    capsys.readouterr()
    assert main(["check-config", str(path), "--input-retention-ms", "60000"]) == 2
    assert "under an hour" in capsys.readouterr().err
    monkeypatch.setenv(RETENTION_ENV, "a week")
    assert main(["check-config", str(path)]) == 2
    assert "STREAM_DP_INPUT_RETENTION_MS='a week' is not a whole number" in capsys.readouterr().err


def test_an_unexpected_failure_while_building_is_named_not_raised(monkeypatch, capsys):
    from stream_dp.worker.assemble import runtimes

    def overflowing_plan(query):
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(runtimes, "build_plan", overflowing_plan)
    assert main(["check-config", str(EXAMPLE)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    names = [q["name"] for q in yaml.safe_load(EXAMPLE.read_text())["queries"]]
    assert lines == [
        f"{EXAMPLE}: queries[{i}] ({name}): OverflowError: cannot convert float infinity to integer "
        "(the worker cannot be built from these values)"
        for i, name in enumerate(names)
    ]


def test_a_continual_querys_window_cap_is_stated_and_its_default_named(tmp_path, capsys):
    # The issue's short form, continual: {period: 1d}: a unit counts in one window a day unless told more.
    config = yaml.safe_load(EXAMPLE.read_text())
    today = next(q for q in config["queries"] if "continual" in q)
    today["continual"] = {"period": "1d"}
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert (f"query {today['name']}:" in out and "  continual: a unit counts in at most 1 window(s) of each period "
            "(max_windows_per_unit 1, the default)" in out), out
    today["continual"]["max_windows_per_unit"] = 10
    path.write_text(yaml.safe_dump(config))
    assert main(["check-config", str(path)]) == 0
    assert "at most 10 window(s) of each period (max_windows_per_unit 10);" in capsys.readouterr().out


# The options' snippets as the README writes them (tests/config/corpus): each is accepted, and the setting it
# leaves out and is given is said under its query line.
IMPLIED = [
    ("ok_quantiles_without_a_count", "query value_quantiles: ", "['count', 'quantiles'], laplace epsilon=0.1",
     "  count added beside quantiles: each group's noisy count sizes its 95% q_interval; it takes its equal share "
     "of epsilon"),
    ("ok_top_k_over_selected_groups_without_a_count", "query top_terms: ", "['count', 'top_k'], laplace epsilon=0.2",
     "  count added beside top_k over selected groups: partition selection of the noisy counts picks the groups "
     "top_k ranks; it takes its equal share of epsilon"),
    ("ok_local_dp_without_the_querys_epsilon", "query browsers_local: ", "epsilon=2 per report, no central noise",
     "  epsilon 2 taken from local_dp.epsilon: what a window costs a unit is its one report"),
]


@pytest.mark.parametrize(("name", "query", "header_end", "line"), IMPLIED, ids=[case[0] for case in IMPLIED])
def test_a_setting_a_query_leaves_out_and_is_given_is_said(name, query, header_end, line, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.delenv(RETENTION_ENV, raising=False)
    path = ROOT / "tests" / "config" / "corpus" / f"{name}.yaml"
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, text in enumerate(out) if text.startswith(query))
    assert out[at].endswith(header_end) and out[at + 1] == line, out
    # written out in full, the query says nothing more
    config = written_out(yaml.safe_load(path.read_text()))
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text(yaml.safe_dump(config))
    assert main(["check-config", str(explicit)]) == 0
    out_explicit = capsys.readouterr().out.splitlines()
    assert [text for text in out if text != line] == [text.replace(str(explicit), str(path)) for text in out_explicit]


def test_geometric_is_named_as_written(tmp_path, capsys):
    config = yaml.safe_load(EXAMPLE.read_text())
    config["queries"][0]["mechanism"] = "geometric"
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["check-config", str(path)]) == 0
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("query pageviews_by_page:"))
    assert first.endswith(", geometric (the discrete Laplace, released as laplace) epsilon=0.5"), first


def test_a_custom_internal_prefix_is_checked_by_check_config_and_run_alike(worker_env, tmp_path, monkeypatch, capsys):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["queries"][0]["output_topic"] = "team-b.alerts"
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["check-config", str(path)]) == 0  # under the default prefix it is just a topic name
    capsys.readouterr()
    monkeypatch.setenv("STREAM_DP_INTERNAL_TOPIC_PREFIX", "team-b.")
    monkeypatch.setenv("STREAM_DP_GROUP_ID", "team-b")
    assert main(["check-config", str(path)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{path}: queries[0] ({data['queries'][0]['name']}).output_topic: output_topic "
                           "'team-b.alerts' is the worker's internal alerts topic")
    assert run_until_kafka(path, monkeypatch) == (1, None)
    assert line in capsys.readouterr().err


def test_run_refuses_a_group_of_its_own_on_the_default_topic_prefix(worker_env, monkeypatch, capsys):
    monkeypatch.setenv("STREAM_DP_GROUP_ID", "team-b")
    monkeypatch.delenv("STREAM_DP_INTERNAL_TOPIC_PREFIX", raising=False)
    assert run_until_kafka(EXAMPLE, monkeypatch) == (1, None)
    assert "set STREAM_DP_INTERNAL_TOPIC_PREFIX='team-b.'" in capsys.readouterr().err
    monkeypatch.setenv("STREAM_DP_INTERNAL_TOPIC_PREFIX", "team-b.")
    assert run_until_kafka(EXAMPLE, monkeypatch) == (0, None)
