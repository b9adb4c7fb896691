"""The README's five-minute tour, command by command, on the real services.

The commands are read from the tour's bash blocks, so the README cannot drift from what works. They run
as written but on a copy of ``deploy/queries.example.yaml`` whose queries, topics and namespaces carry a
name of this run (earlier runs' events, releases and budgets play no part), with the environment the
tour's first lines set (the services' addresses, a contribution secret) given by the fixtures. Each
command must exit 0 and print what the README says it prints.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.reliability.topics import delete_topics
from tests.deploy.stack import scrape, wait_for
from tests.worker._support import free_port

pytestmark = [pytest.mark.services, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "deploy/queries.example.yaml"


def tour_commands() -> list[str]:
    """The tour's commands in order: one per line of its bash blocks, continuations joined, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", tour, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line:
                commands.append(line)
    return commands


def tour_python() -> list[str]:
    """The tour's Python blocks, in order."""
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", tour, flags=re.S)


def _python_as_run_here(code: str, config: Path, tag: str) -> str:
    """A tour Python block on this run's copy of the example (its file and query names)."""
    code = code.replace(f'"{EXAMPLE}"', repr(str(config)))
    return re.sub(r'\.query\("(\w+)"\)', rf'.query("{tag}_\1")', code)


def _renamed_example(path: Path, tag: str) -> dict:
    document = yaml.safe_load((ROOT / EXAMPLE).read_text())
    document["namespaces"] = {f"{tag}_{name}": ns for name, ns in document["namespaces"].items()}
    for query in document["queries"]:
        query["name"] = f"{tag}_{query['name']}"
        query["privacy_unit"]["namespace"] = f"{tag}_{query['privacy_unit']['namespace']}"
        query["input_topic"] = f"{tag}.{query['input_topic']}"
        query["output_topic"] = f"{tag}.{query['output_topic']}"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return document


def _as_run_here(command: str, config: Path, tag: str) -> list[str]:
    """A tour command on this run's copy of the example: its queries, topics and namespaces renamed."""
    command = command.replace(EXAMPLE, str(config))
    command = re.sub(r"--topic (\S+)", rf"--topic {tag}.\1", command)
    command = re.sub(r"--namespace (\S+)", rf"--namespace {tag}_\1", command)
    words = shlex.split(command)
    assert words[0] == ".venv/bin/stream-dp", f"the tour runs stream-dp commands only, not {command!r}"
    return [sys.executable, "-m", "stream_dp.cli.main", *words[1:]]


def test_the_tour_runs_as_the_readme_writes_it(tmp_path, kafka_bootstrap, redis_url, unique_name):
    tag = "tour_" + unique_name.rsplit("-", 1)[1]
    config = tmp_path / "queries.yaml"
    document = _renamed_example(config, tag)
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_CONTRIBUTION_SECRET="tour-" + "0123456789abcdef" * 2, STREAM_DP_GROUP_ID=f"{tag}-g",
               STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{tag}.", STREAM_DP_METRICS_PORT=str(free_port()))
    commands = tour_commands()
    # the first lines set the environment the fixtures give here; every other line is a stream-dp command
    assert [c.split()[0] for c in commands[:2]] == ["eval", "export"], commands[:2]
    worker = None
    background: list[subprocess.Popen] = []
    outputs: dict[str, str] = {}
    export_port = free_port()
    log = (tmp_path / "worker.log").open("w")
    try:
        for command in commands[2:]:
            if command.endswith("&"):  # the worker and the exporter, in the background
                argv = _as_run_here(command.split(">", 1)[0].rstrip(" &"), config, tag)
                assert argv[3] in ("run", "export"), command
                if argv[3] == "export":  # on a port of its own: other runs may use the default
                    argv += ["--port", str(export_port)]
                background.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
                worker = worker or background[-1]
                continue
            done = subprocess.run(_as_run_here(command, config, tag), env=env, cwd=ROOT, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            outputs[command] = done.stdout
            assert worker is None or worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        by_verb = {" ".join(c.split()[1:3]): out for c, out in outputs.items()}
        plan = next(out for verb, out in by_verb.items() if verb.startswith("plan"))
        assert f"query {tag}_pageviews_by_page" in plan
        tail_table = next(out for c, out in outputs.items() if " tail " in c and "--json" not in c)
        rows = [line for line in tail_table.splitlines() if re.match(r"^\d{4}-\d\d-\d\dT", line)]
        groups = set(document["queries"][0]["groups"]["public"])
        assert rows and all(line.split()[1] in groups for line in rows), tail_table
        tail_json = next(out for c, out in outputs.items() if " tail " in c and "--json" in c)
        records = [json.loads(line) for line in tail_json.splitlines()]
        assert records and all(r["query"] == f"{tag}_top_pages" for r in records), tail_json
        show = next(out for c, out in outputs.items() if " budget show " in c)
        assert "unit u0" in show and "epsilon" in show, show
        # the Python block publishes one event through stream_dp.producer
        (code,) = tour_python()
        done = subprocess.run([sys.executable, "-c", _python_as_run_here(code, config, tag)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "1", done.stdout + done.stderr
        # the exporter shows the releases the tour's tail printed
        assert len(background) == 2, "the tour starts a worker and an exporter"
        series = f'stream_dp_release_value{{group="/docs",query="{tag}_pageviews_by_page",statistic="count"}}'
        wait_for(lambda: series in (scrape(export_port) or ""), timeout_s=60, what=f"{series} on the exporter")
    finally:
        for process in reversed(background):
            process.terminate()
            process.wait(timeout=60)
        log.close()
        topics = [q[k] for q in document["queries"] for k in ("input_topic", "output_topic")]
        delete_topics(kafka_bootstrap, sorted(set(topics)) + [f"{tag}.{t}" for t in ("partials", "alerts", "dead-letter")])
