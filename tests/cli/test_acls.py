"""``stream-dp acls``: what it prints, what it refuses (the ACLs on a broker: tests/worker/access)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_dp.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"


@pytest.fixture(autouse=True)
def worker_settings(monkeypatch):
    for name in ("KAFKA_SASL_USERNAME", "KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STREAM_DP_GROUP_ID", "workers")
    monkeypatch.setenv("STREAM_DP_INTERNAL_TOPIC_PREFIX", "dp-internal.")


def test_prints_kafka_acls_commands_and_the_redis_rule(capsys):
    assert main(["acls", "--config", str(EXAMPLE), "--worker-principal", "User:w"]) == 0
    out = capsys.readouterr().out
    assert "--allow-principal User:w --operation Create --operation Describe --operation DescribeConfigs " \
           "--operation Read --operation Write --topic dp-internal.partials" in out
    assert "--allow-principal User:w --operation Describe --operation Read --group workers-release" in out
    assert "--allow-principal User:stream-dp-analyst" in out and "--allow-principal User:stream-dp-producer" in out
    assert "user stream-dp on ><password> resetkeys ~dp:* ~stream-dp:ledger:* ~stream-dp:periods:*" in out


def test_json_lists_every_binding_with_its_reason(capsys):
    assert main(["acls", "--config", str(EXAMPLE), "--json", "--producer-principal", "events.visits=User:v"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert all(a["why"] and a["permission"] == "Allow" for a in plan["kafka"])
    writers = {a["principal"] for a in plan["kafka"] if a["resource_name"] == "events.visits" and a["operation"] == "Write"}
    assert writers == {"User:v"}
    assert "+evalsha" in plan["redis"]["acl_file_line"]


def test_refuses_an_analyst_prefix_covering_the_workers_group(capsys):
    assert main(["acls", "--config", str(EXAMPLE), "--analyst-group-prefix", "work"]) == 1
    assert "covers the worker's group 'workers'" in capsys.readouterr().err


@pytest.mark.services
def test_apply_on_a_broker_without_an_authorizer_says_so(kafka_bootstrap, monkeypatch, capsys):
    """Nothing changes on the shared broker: it has no authorizer, so it refuses every ACL."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["acls", "--config", str(EXAMPLE), "--apply"]) == 1
    err = capsys.readouterr().err
    assert "SecurityDisabled" in err or "refused" in err, err


def doctored(tmp_path, **update) -> Path:
    import yaml

    data = yaml.safe_load(EXAMPLE.read_text())
    data["queries"][0].update(update)
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("field", ["input_topic", "output_topic"])
def test_refuses_a_query_topic_named_like_an_internal_one_before_printing_or_applying(tmp_path, capsys, field):
    path = doctored(tmp_path, **{field: "dp-internal.partials"})
    assert main(["acls", "--config", str(path), "--apply"]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert f"{field} 'dp-internal.partials' is the worker's internal partials topic" in out.err


def test_refuses_a_group_of_its_own_on_the_default_topic_prefix(monkeypatch, capsys):
    monkeypatch.delenv("STREAM_DP_INTERNAL_TOPIC_PREFIX")
    assert main(["acls", "--config", str(EXAMPLE), "--apply"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "set STREAM_DP_INTERNAL_TOPIC_PREFIX='workers.'" in out.err


def test_principals_must_name_one_user_unless_the_flag_says_otherwise(capsys):
    assert main(["acls", "--config", str(EXAMPLE), "--analyst-principal", "User:*"]) == 1
    assert "wildcard" in capsys.readouterr().err
    assert main(["acls", "--config", str(EXAMPLE), "--producer-principal", "User:x,User:y"]) == 1
    assert "whitespace or a comma" in capsys.readouterr().err
    assert main(["acls", "--config", str(EXAMPLE), "--worker-principal", "Service:w"]) == 1
    assert "--custom-principal-types" in capsys.readouterr().err
    assert main(["acls", "--config", str(EXAMPLE), "--worker-principal", "Service:w", "--custom-principal-types"]) == 0
    assert "--allow-principal Service:w" in capsys.readouterr().out


def test_refuses_a_topic_given_two_producers(capsys):
    args = ["--producer-principal", "events.visits=User:a", "--producer-principal", "events.visits=User:b"]
    assert main(["acls", "--config", str(EXAMPLE), *args]) == 1
    assert "names topic 'events.visits' twice" in capsys.readouterr().err
