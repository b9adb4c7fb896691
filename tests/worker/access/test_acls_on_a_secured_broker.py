"""The ACLs of ``stream-dp acls`` on a broker that authorizes every request, and the Redis rule on a Redis
whose default user is off.

One private broker for the module (``deploy/kafka/broker.sh`` with ``KAFKA_AUTH=scram``: SASL/SCRAM, KRaft's
``StandardAuthorizer``, ``allow.everyone.if.no.acl.found=false``) and one private ``redis-server`` whose only
users are an admin and the worker's user with the printed rule. After ``stream-dp acls --apply``:

* the worker runs end to end with only its ACLs and its Redis rule: events in, a release out;
* the analyst reads the output topic and is refused on the partials, alerts, dead-letter and input topics
  (and the check that says so fails for an analyst given more);
* the producer writes its input topic and nothing else;
* the worker's Redis user is refused on keys outside its prefixes and on commands outside its rule;
* a worker missing one ACL of its plan refuses to start, naming the ACL and the command that grants it;
* ``acls --check`` passes on the plan alone, fails once a stale user may read the partials, and the
  ``--remove`` commands it prints drop exactly the stale bindings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import orjson
import pytest
import redis
import yaml

from tests.reliability.services import PrivateRedis, free_port
from tests.reliability.workers import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.services]

REPO = Path(__file__).resolve().parents[3]
ADMIN_PASSWORD = "acl-admin-pw-4c1f9e"
USERS = {"worker": "acl-worker-pw-7a2b", "producer": "acl-producer-pw-0d3e", "analyst": "acl-analyst-pw-91c4",
         "doctored": "acl-doctored-pw-5e6f", "doctored-group": "acl-doctored-pw-7c1d", "greedy": "acl-greedy-pw-2b8a"}
REDIS_ADMIN = ("admin", "redis-admin-pw-8d0c")
REDIS_WORKER = ("dpworker", "redis-worker-pw-3f5a")
SECRET = "acl-test-secret-0123456789abcdef"
WINDOW_MS = 2_000


def _kafka():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka
    return kafka


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A SCRAM broker with the authorizer on, started and stopped by the project's own script."""
    run_dir = tmp_path_factory.mktemp("kafka-acls")
    port, controller = free_port(), free_port()
    env = {**os.environ, "KAFKA_AUTH": "scram", "STREAM_DP_RUN_DIR": str(run_dir), "KAFKA_PORT": str(port),
           "KAFKA_CONTROLLER_PORT": str(controller), "KAFKA_HEAP": "384m", "KAFKA_ADMIN_PASSWORD": ADMIN_PASSWORD,
           "KAFKA_SCRAM_USERS": ",".join(f"{name}={pw}" for name, pw in USERS.items()), "PYTHON": sys.executable}
    script = str(REPO / "deploy" / "kafka" / "broker.sh")
    started = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=60)


def sasl(user: str, password: str | None = None) -> dict[str, str]:
    """kafka-python's options for ``user`` (SCRAM-SHA-512, as the worker's env below; the admin: SHA-256)."""
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user,
            "sasl_plain_password": password if password is not None else USERS[user]}


def kafka_env(bootstrap: str, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    return {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": mechanism, "KAFKA_SASL_USERNAME": user, "KAFKA_SASL_PASSWORD": password}


class Pipeline:
    """One query's names, its file and the worker settings that place its topics and groups."""

    def __init__(self, work_dir: Path) -> None:
        name = f"acl-{uuid.uuid4().hex[:8]}"
        self.input, self.output, self.prefix, self.group = f"{name}-in", f"{name}-out", f"{name}.", f"{name}-g"
        self.internal = {role: f"{self.prefix}{role}" for role in ("partials", "alerts", "dead-letter")}
        self.analyst_groups = f"{name}-analyst-"
        self.config = work_dir / f"{name}.yaml"
        self.config.write_text(yaml.safe_dump({
            "namespaces": {f"{name}-units": {"budgets": [{"horizon": "1h", "epsilon": 1000.0}]}},
            "queries": [{
                "name": name.replace("-", "_"), "input_topic": self.input, "output_topic": self.output,
                "privacy_unit": {"namespace": f"{name}-units", "field": "user_id"}, "timestamp_field": "ts",
                "window": {"size": f"{WINDOW_MS}ms", "allowed_lateness": "200ms", "idle_timeout": "10m"},
                "group_by": ["page"], "groups": {"public": ["home", "search"]},
                "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 5},
                "aggregations": {"count": {}}, "epsilon": 1.0, "release_timeout": "10m",
            }],
        }, sort_keys=False))
        self.settings = {"STREAM_DP_GROUP_ID": self.group, "STREAM_DP_INTERNAL_TOPIC_PREFIX": self.prefix,
                         "STREAM_DP_PARTIALS_PARTITIONS": "1", "STREAM_DP_OUTPUT_PARTITIONS": "1"}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))}
    return {**env, **extra}


def stream_dp(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stream_dp.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def acls(pipeline: Pipeline, bootstrap: str, *extra: str, worker: str = "User:worker") -> dict:
    """``stream-dp acls --json`` of the pipeline (as an admin, so ``--apply`` among ``extra`` applies it)."""
    done = stream_dp("acls", "--config", str(pipeline.config), "--json", "--worker-principal", worker,
                     "--producer-principal", "User:producer", "--analyst-principal", "User:analyst",
                     "--analyst-group-prefix", pipeline.analyst_groups, "--redis-user", REDIS_WORKER[0], *extra,
                     env=clean_env(**pipeline.settings, **kafka_env(bootstrap, "admin", ADMIN_PASSWORD, "SCRAM-SHA-256")))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def admin(bootstrap: str):
    return _kafka().KafkaAdminClient(bootstrap_servers=bootstrap, **sasl("admin", ADMIN_PASSWORD))


def can_read(bootstrap: str, user: str, topic: str, *, group: str | None = None, timeout_s: float = 20.0) -> list[bytes]:
    """The records ``user`` reads from ``topic`` (partition 0, from the start); raises the broker's refusal."""
    kafka = _kafka()
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                   auto_offset_reset="earliest", **sasl(user))
    try:
        if group is None:
            consumer.assign([kafka.TopicPartition(topic, 0)])
        else:
            consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not values:
            for batch in consumer.poll(timeout_ms=500).values():
                values += [r.value for r in batch]
        return values
    finally:
        consumer.close()


def _librdkafka(user: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": USERS[user]}


def _may_describe(bootstrap: str, user: str, topic: str) -> bool:
    """False when the broker answers ``user``'s metadata request for ``topic`` with TOPIC_AUTHORIZATION_FAILED:
    it may not even learn that the topic exists, so it may neither read nor write it."""
    client = _kafka().KafkaAdminClient(bootstrap_servers=bootstrap, **sasl(user))
    try:
        (entry,) = client.describe_topics([topic])
    finally:
        client.close()
    assert entry["error_code"] in (0, 29), entry
    return entry["error_code"] == 0


def refused_read(bootstrap: str, user: str, topic: str, *, timeout_s: float = 20.0) -> bool:
    """True when the broker refuses ``user`` reading ``topic`` (no Describe, or a fetch refused with
    TOPIC_AUTHORIZATION_FAILED); False when ``user`` reads a record of it. ``topic`` must hold records."""
    if not _may_describe(bootstrap, user, topic):
        return True
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, **_librdkafka(user), "group.id": f"probe-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is None:
                return False
            if message.error().name() == "TOPIC_AUTHORIZATION_FAILED":
                return True
    finally:
        consumer.close()
    raise AssertionError(f"{user} neither read {topic} nor was refused within {timeout_s:.0f} s")


def refused_write(bootstrap: str, user: str, topic: str) -> bool:
    """True when the broker refuses ``user`` writing ``topic``; False when a record of its is acknowledged."""
    if not _may_describe(bootstrap, user, topic):
        return True
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **_librdkafka(user), "message.timeout.ms": 15000})
    outcome: list = []
    producer.produce(topic, b"not an event: a probe of the producer's rights",
                     on_delivery=lambda error, _message: outcome.append(error))
    producer.flush(20)
    assert outcome, f"no answer to {user}'s write to {topic}"
    if outcome[0] is None:
        return False
    assert outcome[0].name() == "TOPIC_AUTHORIZATION_FAILED", outcome[0]
    return True


def assert_analyst_confined(bootstrap: str, pipeline: Pipeline, analyst: str) -> None:
    """``analyst`` reads nothing but the output topic: every internal topic and the input refuse it (each holds
    records: an analyst allowed to read one reads a record)."""
    for topic in [pipeline.input, *pipeline.internal.values()]:
        assert refused_read(bootstrap, analyst, topic), f"{analyst} could read {topic}"


@pytest.fixture(scope="module")
def worker_redis(tmp_path_factory):
    """A Redis whose default user is off; the worker's user gets exactly the rule ``stream-dp acls`` prints
    (set in ``running``)."""
    server = PrivateRedis(tmp_path_factory.mktemp("redis-acls"), admin=REDIS_ADMIN,
                          acl=f"user default off\nuser {REDIS_ADMIN[0]} on >{REDIS_ADMIN[1]} ~* &* +@all\n")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def running(broker, worker_redis, tmp_path_factory):
    """The pipeline after ``stream-dp acls --apply``, its worker running with only its ACLs and Redis rule,
    and events of the producer's in its input topic."""
    work_dir = tmp_path_factory.mktemp("acl-pipeline")
    pipeline = Pipeline(work_dir)
    plan = acls(pipeline, broker, "--apply")
    rule = plan["redis"]["acl_setuser"].replace("<password>", REDIS_WORKER[1]).split(" ")
    worker_redis.client().execute_command(*rule)
    # the input topic as an operator creates it (the worker would create a missing one too)
    kafka = _kafka()
    client = admin(broker)
    try:
        client.create_topics([kafka.admin.NewTopic(pipeline.input, 1, 1,
                                                   topic_configs={"message.timestamp.type": "LogAppendTime"})])
    finally:
        client.close()
    env = clean_env(**pipeline.settings, **kafka_env(broker, "worker", USERS["worker"]),
                    STREAM_DP_CONTRIBUTION_SECRET=SECRET, STREAM_DP_REDIS_TIMEOUT_S="2",
                    REDIS_URL=worker_redis.url(*REDIS_WORKER))
    worker = WorkerProcess("worker", pipeline.config, env, work_dir)
    worker.start()
    producer = kafka.KafkaProducer(bootstrap_servers=broker, acks="all", **sasl("producer"))
    try:
        yield pipeline, plan, worker, producer
    finally:
        producer.close(timeout=5)
        worker.kill()


def _produce_until_released(broker: str, pipeline: Pipeline, worker: WorkerProcess, producer) -> list[bytes]:
    """Events of 20 units every 200 ms (the broker stamps them, so windows close as time passes) until the
    analyst reads a release; returns the release records."""
    deadline = time.monotonic() + 120
    i = 0
    while time.monotonic() < deadline:
        assert worker.alive, f"the worker stopped; see {worker.log_path}:\n{worker.log_text()[-3000:]}"
        for unit in range(20):
            event = {"user_id": f"u{unit}", "ts": int(time.time() * 1000), "page": "home" if unit % 2 else "search"}
            producer.send(pipeline.input, key=f"u{unit}".encode(), value=orjson.dumps(event))
        producer.send(pipeline.input, key=b"u0", value=b"not json: a dead letter")
        producer.flush()
        i += 1
        if i % 10 == 0:
            released = can_read(broker, "analyst", pipeline.output, group=f"{pipeline.analyst_groups}reader",
                                timeout_s=2)
            if released:
                return released
        time.sleep(0.2)
    raise AssertionError(f"no release within 120 s; see {worker.log_path}:\n{worker.log_text()[-3000:]}")


def test_the_worker_runs_end_to_end_with_only_its_acls(broker, running):
    pipeline, plan, worker, producer = running
    released = _produce_until_released(broker, pipeline, worker, producer)
    record = orjson.loads(released[0])
    assert record["window"]["end_ms"] - record["window"]["start_ms"] == WINDOW_MS, record
    # the producer's events went through the worker: partials exist, which only the worker may read
    kafka = _kafka()
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker, **sasl("admin", ADMIN_PASSWORD))
    try:
        assert consumer.end_offsets([kafka.TopicPartition(pipeline.internal["partials"], 0)])
    finally:
        consumer.close()
    log = worker.log_text()
    assert "Kafka rights of User:worker" in log, log[-2000:]
    assert "beyond what it needs" not in log, "the plan granted the worker more than its check asks for"
    granted = {(a["principal"], a["resource_type"], a["resource_name"], a["operation"]) for a in plan["kafka"]}
    assert ("User:worker", "Topic", pipeline.input, "Read") in granted
    assert not any(p == "User:worker" and op == "Alter" for p, _, _, op in granted)


def test_the_analyst_reads_the_output_topic_and_nothing_else(broker, running):
    pipeline, _plan, worker, producer = running
    _produce_until_released(broker, pipeline, worker, producer)  # every internal topic exists and holds records
    assert can_read(broker, "analyst", pipeline.output), "the analyst could not read the output topic"
    assert_analyst_confined(broker, pipeline, "analyst")
    # its consumer groups are its own: the worker's may not be joined
    errors = _kafka().errors
    with pytest.raises(errors.GroupAuthorizationFailedError):
        can_read(broker, "analyst", pipeline.output, group=pipeline.group, timeout_s=6)


def test_the_confinement_check_fails_for_an_analyst_given_more(broker, running):
    """The check above, on an analyst granted what the plan does not give: Read on the partials topic."""
    pipeline, _plan, _worker, _producer = running
    kafka = _kafka()
    client = admin(broker)
    try:
        resource = kafka.admin.ResourcePattern(kafka.admin.ResourceType.TOPIC, pipeline.internal["partials"],
                                               kafka.admin.ACLResourcePatternType.LITERAL)
        client.create_acls([kafka.admin.ACL("User:greedy", "*", operation, kafka.admin.ACLPermissionType.ALLOW,
                                            resource)
                            for operation in (kafka.admin.ACLOperation.READ, kafka.admin.ACLOperation.DESCRIBE)])
    finally:
        client.close()
    with pytest.raises(AssertionError, match="could read"):
        assert_analyst_confined(broker, pipeline, "greedy")


def test_the_producer_writes_its_input_topic_and_nothing_else(broker, running):
    pipeline, _plan, worker, producer = running
    _produce_until_released(broker, pipeline, worker, producer)
    assert not refused_write(broker, "producer", pipeline.input)
    for topic in [pipeline.output, *pipeline.internal.values()]:
        assert refused_write(broker, "producer", topic), f"the producer could write {topic}"
    for topic in [pipeline.input, pipeline.output, *pipeline.internal.values()]:
        assert refused_read(broker, "producer", topic), f"the producer could read {topic}"


def test_the_worker_redis_user_stays_inside_its_prefixes(broker, running, worker_redis):
    pipeline, plan, worker, producer = running
    _produce_until_released(broker, pipeline, worker, producer)
    keys = {k.decode() for k in worker_redis.client().scan_iter(count=1000)}
    prefixes = tuple(p.rstrip("*") for p in plan["redis"]["key_patterns"])
    assert keys and all(k.startswith(prefixes) for k in keys), sorted(keys)[:10]
    assert any(k.startswith("dp:") for k in keys) and any(k.startswith("stream-dp:ledger:") for k in keys)
    as_worker = redis.Redis.from_url(worker_redis.url(*REDIS_WORKER), socket_timeout=5)
    try:
        as_worker.set("dp:acl-probe", b"1")  # inside: allowed
        for denied in (lambda: as_worker.get("other:key"), lambda: as_worker.set("users:1", b"x"),
                       lambda: as_worker.get("stream-dp:elsewhere"), lambda: as_worker.keys("*"),
                       lambda: as_worker.config_get("requirepass"), lambda: as_worker.flushall(),
                       lambda: as_worker.eval("return redis.call('GET', KEYS[1])", 1, "other:key")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
    finally:
        as_worker.close()


@pytest.mark.parametrize(("user", "dropped", "named"), [
    ("doctored", ("partials", "Write"), "User:doctored may not Write Topic '{partials}' (partials topic)"),
    # a group not created yet shows the start check only Describe: the broker refuses the join
    ("doctored-group", ("release group", "Read"), "the broker refuses the worker's Kafka principal the consumer group "
                                                  "{release group} (it needs Read and Describe on it)"),
], ids=["write-on-partials", "read-on-release-group"])
def test_a_worker_missing_one_acl_refuses_to_start_and_names_it(broker, running, worker_redis, tmp_path, user,
                                                                 dropped, named):
    """A second pipeline whose worker principal got its plan less one ACL."""
    pipeline = Pipeline(tmp_path)
    names = {**pipeline.internal, "release group": f"{pipeline.group}-release"}
    principal = f"User:{user}"
    plan = acls(pipeline, broker, worker=principal)
    kept = [a for a in plan["kafka"] if a["principal"] == principal
            and not (a["resource_name"] == names[dropped[0]] and a["operation"] == dropped[1])]
    assert len(kept) == len([a for a in plan["kafka"] if a["principal"] == principal]) - 1
    from stream_dp.worker.kafka.acl_admin import create_acls

    options = {"bootstrap_servers": broker, **sasl("admin", ADMIN_PASSWORD)}
    assert not create_acls(options, [(a["principal"], a["resource_type"], a["resource_name"], a["pattern_type"],
                                      a["operation"]) for a in kept])
    env = clean_env(**pipeline.settings, **kafka_env(broker, user, USERS[user]),
                    STREAM_DP_CONTRIBUTION_SECRET=SECRET, REDIS_URL=worker_redis.url(*REDIS_WORKER))
    done = subprocess.run([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(pipeline.config)],
                          env={**env, "STREAM_DP_METRICS_PORT": str(free_port())}, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 1, done.stderr[-3000:]
    assert named.format(**names) in done.stderr, done.stderr[-3000:]
    assert "stream-dp acls --config" in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    # refused before it wrote a record
    kafka = _kafka()
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker, **sasl("admin", ADMIN_PASSWORD))
    try:
        ends = consumer.end_offsets([kafka.TopicPartition(t, 0) for t in (pipeline.output, *pipeline.internal.values())])
    finally:
        consumer.close()
    assert set(ends.values()) == {0}, ends


def acls_check(pipeline: Pipeline, bootstrap: str, monkeypatch, capsys) -> tuple[int, str]:
    """``stream-dp acls --check`` as an admin, in this process (a subprocess costs seconds of start-up)."""
    from stream_dp.cli.main import main

    for name in [n for n in os.environ if n.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))]:
        monkeypatch.delenv(name)
    for name, value in {**pipeline.settings, **kafka_env(bootstrap, "admin", ADMIN_PASSWORD, "SCRAM-SHA-256")}.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    status = main(["acls", "--config", str(pipeline.config), "--check", "--worker-principal", "User:worker",
                   "--producer-principal", "User:producer", "--analyst-principal", "User:analyst",
                   "--analyst-group-prefix", pipeline.analyst_groups])
    out = capsys.readouterr()
    return status, out.out + out.err


def _drop_as_printed(bootstrap: str, command: str) -> int:
    """Delete the ACLs a printed ``kafka-acls.sh --remove`` names, read from its own arguments (the broker
    image has no kafka-acls.sh): proves the command names exactly the stale binding."""
    import shlex

    kafka = _kafka()
    words = shlex.split(command)
    arg = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    side = "allow" if "--allow-principal" in arg else "deny"
    kind, name = ("GROUP", arg["--group"]) if "--group" in arg else ("TOPIC", arg["--topic"])
    enum = {"All": "ALL", "Read": "READ", "Write": "WRITE", "Describe": "DESCRIBE"}
    acl_filter = kafka.admin.ACLFilter(
        arg[f"--{side}-principal"], arg[f"--{side}-host"], kafka.admin.ACLOperation[enum[arg["--operation"]]],
        kafka.admin.ACLPermissionType[side.upper()],
        kafka.admin.ResourcePatternFilter(kafka.admin.ResourceType[kind], name,
                                          kafka.admin.ACLResourcePatternType[arg["--resource-pattern-type"].upper()]))
    client = admin(bootstrap)
    try:
        ((_, matched, error),) = client.delete_acls([acl_filter])
    finally:
        client.close()
    assert error is kafka.errors.NoError or isinstance(error, kafka.errors.NoError), error
    return len(matched)


def test_acls_check_lists_grants_beyond_the_plan_and_fails_on_a_reader_of_the_partials(broker, running, tmp_path,
                                                                                       monkeypatch, capsys):
    """``--apply`` only adds: a stale grant stays until ``--check`` names it and its --remove drops it."""
    pipeline = Pipeline(tmp_path)
    acls(pipeline, broker, "--apply")
    status, said = acls_check(pipeline, broker, monkeypatch, capsys)
    assert status == 0 and "no ACL on the worker's topics and groups beyond the plan" in said, said
    kafka = _kafka()
    adm = kafka.admin

    def binding(principal, name, operation, *, pattern="LITERAL", permission="ALLOW", host="*"):
        return adm.ACL(principal, host, adm.ACLOperation[operation], adm.ACLPermissionType[permission],
                       adm.ResourcePattern(adm.ResourceType.TOPIC, name, adm.ACLResourcePatternType[pattern]))

    stale = [binding("User:greedy", pipeline.internal["partials"], "READ"),  # an old analyst on the partials
             binding("User:greedy", pipeline.prefix, "ALL", pattern="PREFIXED"),  # every internal topic
             binding("User:analyst", pipeline.input, "DESCRIBE", permission="DENY"),  # a DENY the plan does not hold
             binding("User:bi", pipeline.output, "READ", host="10.0.0.1")]  # another reader of releases
    client = admin(broker)
    try:
        assert not client.create_acls(stale)["failed"]
    finally:
        client.close()
    status, said = acls_check(pipeline, broker, monkeypatch, capsys)
    assert status == 1 and "2 letting a principal other than the worker read or write" in said, said
    removes = [line for line in said.splitlines() if line.startswith("kafka-acls.sh")]
    assert len(removes) == 4 and sum("DANGER Allow User:greedy" in line for line in said.splitlines()) == 2, said
    for command in removes:
        assert _drop_as_printed(broker, command) == 1, command
    status, said = acls_check(pipeline, broker, monkeypatch, capsys)
    assert status == 0, said
