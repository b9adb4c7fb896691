"""The README's first command, ``bash deploy/demo.sh``, end to end on the real services.

The demo runs on a copy of ``deploy/queries.example.yaml`` whose topics, queries and namespaces carry
a name of this run (so earlier runs' events, releases, ledger entries and budgets play no part), with
fewer events. It must exit 0, and every query of the example must have released records of at least
two windows on its output topic, each valid against the release schema, and printed them.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path

import jsonschema
import orjson
import pytest
import yaml

from tests.reliability.topics import delete_topics, read_topic
from tests.worker._support import free_port

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.heavy]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())


def _renamed_example(path: Path, tag: str) -> tuple[Path, dict]:
    document = yaml.safe_load((REPO / "deploy/queries.example.yaml").read_text())
    document["namespaces"] = {f"{tag}_{name}": ns for name, ns in document["namespaces"].items()}
    for query in document["queries"]:
        query["name"] = f"{tag}_{query['name']}"
        query["privacy_unit"]["namespace"] = f"{tag}_{query['privacy_unit']['namespace']}"
        query["input_topic"] = f"{tag}.{query['input_topic']}"
        query["output_topic"] = f"{tag}.{query['output_topic']}"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path, document


def test_the_demo_releases_every_example_query(tmp_path, kafka_bootstrap, redis_url, unique_name):
    tag = "demo_" + unique_name.rsplit("-", 1)[1]
    config, document = _renamed_example(tmp_path / "queries.yaml", tag)
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url, DEMO_CONFIG=str(config),
               DEMO_EVENTS="20000", DEMO_UNITS="3000", DEMO_TAIL_IDLE_S="20", STREAM_DP_RUN_DIR=str(tmp_path / "run"),
               STREAM_DP_GROUP_ID=f"{tag}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{tag}.",
               STREAM_DP_METRICS_PORT=str(free_port()))
    env.pop("STREAM_DP_CONTRIBUTION_SECRET", None)  # the demo keeps one per run directory
    outputs = [q["output_topic"] for q in document["queries"]]
    topics = outputs + sorted({q["input_topic"] for q in document["queries"]}) + [
        f"{tag}.{t}" for t in ("partials", "alerts", "dead-letter")]
    try:
        done = subprocess.run(["bash", str(REPO / "deploy/demo.sh")], env=env, cwd=REPO, capture_output=True,
                              timeout=900)
        out = done.stdout.decode()
        assert done.returncode == 0, f"demo exited {done.returncode}:\n{out[-3000:]}\n{done.stderr.decode()[-3000:]}"
        validator = jsonschema.Draft202012Validator(SCHEMA)
        problems = []
        for query in document["queries"]:
            records = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, query["output_topic"])]
            windows = {r["window"]["start_ms"] for r in records}
            if len(windows) < 2:
                problems.append(f"{query['name']}: records of {len(windows)} windows on {query['output_topic']}")
            problems += [f"{query['name']}: {e.message}" for r in records for e in validator.iter_errors(r)][:3]
            if f"releases on {query['output_topic']}" not in out:
                problems.append(f"{query['name']}: the demo did not print its releases")
            kinds = collections.Counter(r.get("kind", "group") for r in records)
            if "top_k" in query["aggregations"] and not kinds["top_k"]:
                problems.append(f"{query['name']}: no top_k record")
            if "local_dp" in query and any(r["privacy"]["trust_model"] != "local" for r in records):
                problems.append(f"{query['name']}: a record of the local_dp query not marked local")
        assert not problems, "\n".join(problems) + f"\ndemo output:\n{out[-3000:]}"
    finally:
        delete_topics(kafka_bootstrap, topics)
