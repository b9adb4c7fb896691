"""Private Redis and Kafka instances that a fault run may stop, kill and restart.

The shared services other tests use are never touched: each instance here
has its own ports, data directory and process. Redis runs as the README asks
for production (append-only file, ``appendfsync always``, no eviction), so a
``kill -9`` of Redis loses nothing it acknowledged. The Kafka broker is the
same single-node KRaft broker ``deploy/kafka/broker.sh`` runs, optionally with
a second, SASL/PLAIN listener for clients.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]
KAFKA_VERSION = "4.1.1"


def random_cluster_id(java: list[str]) -> str:
    return subprocess.run(
        [*java, "kafka.tools.StorageTool", "random-uuid"], capture_output=True, text=True, check=True
    ).stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class PrivateRedis:
    """A ``redis-server`` child process on its own port and directory.

    ``acl`` is the text of an ACL file (``user ... on >password ~keys +@commands``);
    ``admin`` names the user and password the harness itself connects with then.
    """

    def __init__(self, directory: Path, *, acl: str | None = None, admin: tuple[str, str] | None = None,
                 fsync: str = "always") -> None:
        """``fsync``: the ``appendfsync`` policy (``always`` as the README asks; ``everysec`` to see a worker
        run on a Redis that may forget its last second)."""
        if acl is not None and admin is None:
            raise ValueError("an ACL file turns the default user off: pass admin=(user, password) for the harness")
        self.directory = directory
        self.port = free_port()
        self.admin = admin
        self.fsync = fsync
        self._acl = acl
        self._process: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def url(self, user: str | None = None, password: str | None = None) -> str:
        if user is None and self.admin is not None:
            user, password = self.admin
        credentials = f"{user}:{password}@" if user else ""
        return f"redis://{credentials}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url(), socket_timeout=5)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 10.0) -> None:
        if self.running:
            return
        args = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
            "--appendonly", "yes", "--appendfsync", self.fsync, "--maxmemory-policy", "noeviction",
            "--save", "", "--daemonize", "no", "--logfile", str(self.directory / "redis.log"),
        ]
        if self._acl is not None:
            acl_file = self.directory / "users.acl"
            acl_file.write_text(self._acl)
            args += ["--aclfile", str(acl_file)]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                time.sleep(0.05)
        raise RuntimeError(f"private redis-server did not answer on port {self.port}; see {self.directory}/redis.log")

    def stop(self, *, crash: bool = True) -> None:
        """``crash``: SIGKILL, as a host failure would (the AOF keeps every acknowledged write)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
            self._process.wait(timeout=20)
        self._process = None


class PrivateKafka:
    """A single-node KRaft broker from the jars ``deploy/kafka/broker.sh fetch`` resolves.

    ``sasl_users`` adds a ``SASL_PLAINTEXT`` listener (mechanism PLAIN) with
    these users; the ``PLAINTEXT`` listener stays for the harness.
    """

    def __init__(self, run_dir: Path, *, sasl_users: dict[str, str] | None = None, heap: str = "384m",
                 node_id: int = 1, replication: int = 1, worker_proxy: bool = False,
                 data_dir: Path | None = None) -> None:
        """``node_id`` and ``replication`` (of internal topics, with ``min.insync.replicas`` one less,
        at least 1) are for a node of ``PrivateKafkaCluster``, which sets ``quorum`` and ``cluster_id``.

        ``worker_proxy``: a second listener for the workers, advertised at a ``PartitionProxy`` in front of
        it (``worker_bootstrap``), so a fault can cut the workers off the broker while the producer and the
        harness still reach it. ``data_dir``: where the log lives (a small filesystem, for a full disk)."""
        self.run_dir = run_dir
        self.data_dir = data_dir or run_dir / "data"
        self.worker_port = free_port() if worker_proxy else None
        self.worker_proxy = None
        if worker_proxy:
            from tests.reliability.tcp_proxy import PartitionProxy

            self.worker_proxy = PartitionProxy(self.worker_port)
        self.node_id = node_id
        self.replication = replication
        self.quorum: list[tuple[int, int]] = []  # (node id, controller port) of every voter; empty: this node alone
        self.cluster_id: str | None = None
        self.port = free_port()
        self.controller_port = free_port()
        self.sasl_port = free_port() if sasl_users else None
        self.sasl_users = dict(sasl_users or {})
        self.heap = heap
        self._process: subprocess.Popen | None = None
        self._formatted = False
        run_dir.mkdir(parents=True, exist_ok=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def worker_bootstrap(self) -> str:
        """Where the workers connect: through the partition proxy if there is one."""
        return f"127.0.0.1:{self.worker_proxy.port}" if self.worker_proxy is not None else self.bootstrap

    @property
    def sasl_bootstrap(self) -> str:
        if self.sasl_port is None:
            raise ValueError("this broker has no SASL listener; create it with sasl_users")
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @staticmethod
    def jars() -> Path:
        cache = Path(os.environ.get("STREAM_DP_CACHE", Path.home() / ".cache" / "stream-dp"))
        lib = cache / f"kafka-{KAFKA_VERSION}" / "lib"
        if not (lib / ".complete").exists():
            subprocess.run(["bash", str(REPO / "deploy" / "kafka" / "broker.sh"), "fetch"], check=True)
        return lib

    def _java(self) -> list[str]:
        return [
            "java", f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={REPO / 'deploy' / 'kafka' / 'log4j2.properties'}",
            "-cp", f"{self.jars()}/*",
        ]

    def _properties(self) -> str:
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}", f"CONTROLLER://127.0.0.1:{self.controller_port}"]
        advertised = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        extra: list[str] = []
        if self.worker_proxy is not None:
            listeners.append(f"WORKERS://127.0.0.1:{self.worker_port}")
            advertised.append(f"WORKERS://127.0.0.1:{self.worker_proxy.port}")
            protocols.append("WORKERS:PLAINTEXT")
        if self.sasl_port is not None:
            listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}")
            advertised.append(f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}")
            protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
            users = " ".join(f'user_{name}="{password}"' for name, password in self.sasl_users.items())
            extra += [
                "sasl.enabled.mechanisms=PLAIN",
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            ]
        voters = self.quorum or [(self.node_id, self.controller_port)]
        rf, isr = self.replication, max(1, self.replication - 1)
        lines = [
            "process.roles=broker,controller",
            f"node.id={self.node_id}",
            "controller.quorum.voters=" + ",".join(f"{n}@127.0.0.1:{port}" for n, port in voters),
            f"listeners={','.join(listeners)}",
            f"advertised.listeners={','.join(advertised)}",
            "controller.listener.names=CONTROLLER",
            f"listener.security.protocol.map={','.join(protocols)}",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.data_dir}",
            "num.partitions=1",
            f"default.replication.factor={rf}",
            f"min.insync.replicas={isr}",
            "unclean.leader.election.enable=false",
            f"offsets.topic.replication.factor={rf}",
            "offsets.topic.num.partitions=2",
            f"transaction.state.log.replication.factor={rf}",
            f"transaction.state.log.min.isr={isr}",
            f"share.coordinator.state.topic.replication.factor={rf}",
            f"share.coordinator.state.topic.min.isr={isr}",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "delete.topic.enable=true",
            *extra,
        ]
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 120.0) -> None:
        if self.running:
            return
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process without waiting (the nodes of a cluster wait for each other)."""
        properties = self.run_dir / "server.properties"
        properties.write_text(self._properties())
        if not self._formatted:
            cluster_id = self.cluster_id or random_cluster_id(self._java())
            subprocess.run(
                [*self._java(), "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties)],
                capture_output=True, text=True, check=True,
            )
            self._formatted = True
        log = open(self.run_dir / "kafka.log", "ab")
        try:
            self._process = subprocess.Popen([*self._java(), "kafka.Kafka", str(properties)], stdout=log, stderr=log)
        finally:
            log.close()

    def wait_ready(self, timeout_s: float) -> None:
        self.wait_ready_all(self.bootstrap, timeout_s)

    def wait_ready_all(self, bootstrap: str, timeout_s: float) -> None:
        """Wait until every broker of ``bootstrap`` (this node's cluster) is registered and unfenced."""
        ready = subprocess.run(
            [sys.executable, str(REPO / "deploy" / "kafka" / "wait_ready.py"), bootstrap, str(timeout_s)],
            capture_output=True, text=True,
        )
        if ready.returncode != 0 or not self.running:
            self.stop(crash=True)
            raise RuntimeError(f"private Kafka broker did not become ready; see {self.run_dir / 'kafka.log'}")
        if self.sasl_port is not None:
            deadline = time.monotonic() + timeout_s
            while not _port_open(self.sasl_port) and time.monotonic() < deadline:
                time.sleep(0.2)

    def stop(self, *, crash: bool = False, timeout_s: float = 30.0) -> None:
        """Controlled shutdown (SIGTERM), or ``crash``: SIGKILL."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None


class PrivateRedisCluster:
    """A Redis Cluster of the run's own (3 masters, 3 replicas, ``tests/budget/cluster_support``), in the
    shape a fault run uses a ``PrivateRedis``: ``client()``, ``url()``, ``start``/``stop``, and the cluster
    itself (``cluster``) for the faults that kill its nodes."""

    def __init__(self, directory: Path) -> None:
        from tests.budget.cluster_support import PrivateCluster

        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.cluster = PrivateCluster(directory)

    def url(self) -> str:
        return self.cluster.url

    def client(self):
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in self.cluster.ports], socket_timeout=5)

    @property
    def running(self) -> bool:
        return not self.cluster.ports_dead

    def start(self) -> None:
        self.cluster.start()

    def stop(self, *, crash: bool = True) -> None:
        self.cluster.stop()


class SmallDiskKafka(PrivateKafka):
    """A private broker whose log directory is a filesystem of its own, ``size_mb`` large (a tmpfs: mounting
    it needs root, see ``can_mount``), which a fault can fill up and free again."""

    def __init__(self, run_dir: Path, *, size_mb: int = 128, **options) -> None:
        self.mount = run_dir / "disk"
        self.mount.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.mount)],
                       check=True, capture_output=True)
        super().__init__(run_dir, data_dir=self.mount / "data", **options)
        self._filler = self.mount / "filler"

    @staticmethod
    def can_mount(directory: Path) -> bool:
        """Whether this process may mount a tmpfs (root, or CAP_SYS_ADMIN)."""
        probe = directory / "probe"
        probe.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                                 capture_output=True).returncode == 0
        if mounted:
            subprocess.run(["umount", str(probe)], capture_output=True)
        return mounted

    def fill_disk(self) -> None:
        """Write a file until the filesystem refuses more (ENOSPC)."""
        block = b"\0" * (1 << 20)
        with open(self._filler, "ab", buffering=0) as filler:
            try:
                while True:
                    filler.write(block)
            except OSError:
                pass
        with open(self._filler, "ab", buffering=0) as filler:  # the last partial block too
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass

    def free_disk(self) -> None:
        self._filler.unlink(missing_ok=True)

    def remove(self) -> None:
        """Stop the broker and unmount its filesystem (its data goes with it)."""
        self.stop(crash=True)
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)


class PrivateKafkaCluster:
    """Three (``nodes``) KRaft nodes on loopback, each broker and controller, as
    ``deploy/kafka/broker.sh`` runs with ``KAFKA_NODES=3``: internal topics and
    new topics replicated ``min(3, nodes)`` times with ``min.insync.replicas``
    one less, no unclean leader election. A node can be killed and restarted
    while the others serve.
    """

    def __init__(self, run_dir: Path, *, nodes: int = 3, heap: str = "320m") -> None:
        self.replication = min(3, nodes)
        self.nodes = [PrivateKafka(run_dir / f"node{i}", heap=heap, node_id=i, replication=self.replication)
                      for i in range(1, nodes + 1)]
        quorum = [(node.node_id, node.controller_port) for node in self.nodes]
        for node in self.nodes:
            node.quorum = quorum

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes)

    def start(self, timeout_s: float = 180.0) -> None:
        """Start every node that is not running and wait until all are registered and unfenced."""
        if self.nodes[0].cluster_id is None:
            cluster_id = random_cluster_id(self.nodes[0]._java())
            for node in self.nodes:
                node.cluster_id = cluster_id
        for node in self.nodes:
            if not node.running:
                node.launch()
        self.nodes[0].wait_ready_all(self.bootstrap, timeout_s)

    def stop(self, *, crash: bool = False) -> None:
        for node in self.nodes:
            node.stop(crash=crash)

    def node(self, node_id: int) -> PrivateKafka:
        return next(node for node in self.nodes if node.node_id == node_id)

    def kill_node(self, node_id: int) -> None:
        self.node(node_id).stop(crash=True)

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> None:
        self.node(node_id).launch()
        self.nodes[0].wait_ready_all(self.bootstrap, timeout_s)

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``topic[partition]`` now."""
        from tests.reliability.topics import _kafka

        admin = _kafka().KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="stream-dp-reliability")
        try:
            (described,) = admin.describe_topics([topic])
        finally:
            admin.close()
        for entry in described["partitions"]:
            if entry["partition_index"] == partition:
                return int(entry["leader_id"])
        raise LookupError(f"{topic}[{partition}] has no partition metadata")
