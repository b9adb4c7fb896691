"""A private Redis Cluster (3 masters + 3 replicas) for tests that kill its nodes.

Started with ``deploy/services.sh start redis-cluster`` in its own run directory
and on its own ports, so killing a master never disturbs the shared cluster
other tests use.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port() -> int:
    """A base port with it and the next 5 free, and their cluster bus ports (+10000) too."""
    for _ in range(200):
        base = random.randrange(20000, 29000)
        if all(_free(p) and _free(p + 10000) for p in range(base, base + 6)):
            return base
    raise RuntimeError("no 6 free consecutive ports (and bus ports) in 20000-29000")


class PrivateCluster:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.base = free_base_port()
        self.ports = list(range(self.base, self.base + 6))
        self._env = {
            **os.environ,
            "STREAM_DP_RUN_DIR": str(directory),
            "STREAM_DP_REDIS_DATA_DIR": str(directory),  # its own, on disk, not the shared cluster's (deploy/test.sh)
            "REDIS_CLUSTER_PORT": str(self.base),
            "REDIS_CLUSTER_NODE_TIMEOUT_MS": "1000",
        }
        self.stopped: set[int] = set()
        self.ports_dead: set[int] = set()

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> None:
        subprocess.run(["bash", str(REPO / "deploy/services.sh"), "start", "redis-cluster"], env=self._env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def stop(self) -> None:
        for port in list(self.stopped):
            self.resume(port)
        subprocess.run(["bash", str(REPO / "deploy/services.sh"), "stop", "redis-cluster"], env=self._env,
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

    def restart(self, port: int) -> None:
        """Start a killed node again (``services.sh start`` starts every node not answering); it rejoins."""
        self.ports_dead.discard(port)
        self.start()

    def wait_replicated(self, master: int, deadline_s: float = 60.0) -> int:
        """Until ``master`` has a replica online (a restarted old master rejoins as one); its port."""
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            client = self.node(master)
            try:
                info = client.info("replication")
                replica = info.get("slave0")
                if isinstance(replica, dict) and replica.get("state") == "online":
                    return int(replica["port"])
            except redis.RedisError:
                pass
            finally:
                client.close()
            time.sleep(0.1)
        raise TimeoutError(f"no replica of {master} came online within {deadline_s} s")

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

    def pid(self, port: int) -> int:
        return int((self.directory / "redis-cluster" / str(port) / "redis.pid").read_text())

    def role(self, port: int) -> str:
        client = self.node(port)
        try:
            return client.role()[0].decode()
        finally:
            client.close()

    def master_of_slot(self, slot: int) -> int:
        client = self.node(self._alive_port())
        try:
            for start, end, master, *_ in client.cluster("slots"):
                if start <= slot <= end:
                    return int(master[1])
        finally:
            client.close()
        raise LookupError(f"slot {slot} has no master")

    def replica_of(self, master_port: int) -> int:
        client = self.node(master_port)
        try:
            info = client.info("replication")
        finally:
            client.close()
        return int(info["slave0"]["port"])

    def blocked_clients(self, port: int) -> int:
        client = self.node(port)
        try:
            return int(client.info("clients")["blocked_clients"])
        finally:
            client.close()

    def cut_off_replica(self, master: int) -> int:
        """Stop ``master``'s writes reaching its replica until the master dies: returns the replica's port.

        The replica is paused (SIGSTOP) and the master drops its link to it. A
        pause alone is not enough: what the master sends still lands in the
        paused replica's socket buffer, and it reads it on waking.
        """
        replica = self.replica_of(master)
        self.pause(replica)
        client = self.node(master)
        try:
            client.execute_command("CLIENT", "KILL", "TYPE", "replica")
        finally:
            client.close()
        return replica

    def masters(self) -> list[int]:
        client = self.node(self._alive_port())
        try:
            return sorted({int(master[1]) for _, _, master, *_ in client.cluster("slots")})
        finally:
            client.close()

    def node_id(self, port: int) -> str:
        client = self.node(port)
        try:
            return client.execute_command("CLUSTER", "MYID").decode()
        finally:
            client.close()

    def begin_migration(self, slot: int, source: int, target: int) -> None:
        """Mark ``slot`` migrating from ``source`` to ``target`` (keys stay put until ``migrate_keys``)."""
        self.node(target).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self.node(source).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))

    def migrate_keys(self, slot: int, source: int, target: int) -> int:
        """Move every key of ``slot`` from ``source`` to ``target``; how many moved."""
        client = self.node(source)
        try:
            keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100_000)
            if keys:
                client.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            return len(keys)
        finally:
            client.close()

    def keys_in_slot(self, port: int, slot: int) -> int:
        client = self.node(port)
        try:
            return int(client.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
        finally:
            client.close()

    def end_migration(self, slot: int, target: int) -> None:
        """Give ``slot`` to ``target`` on every master (as ``redis-cli --cluster reshard`` does)."""
        target_id = self.node_id(target)
        for port in [target, *(p for p in self.masters() if p != target)]:
            self.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def pause(self, port: int) -> None:
        os.kill(self.pid(port), signal.SIGSTOP)
        self.stopped.add(port)

    def resume(self, port: int) -> None:
        os.kill(self.pid(port), signal.SIGCONT)
        self.stopped.discard(port)

    def kill(self, port: int) -> None:
        os.kill(self.pid(port), signal.SIGKILL)
        self.ports_dead.add(port)

    def _alive_port(self) -> int:
        return next(p for p in self.ports if p not in self.ports_dead and p not in self.stopped)

    def wait_promoted(self, replica: int, deadline_s: float = 60.0) -> None:
        """Until ``replica`` is a master and every live node sees the cluster ok; TAKEOVER if no election came."""
        started = time.monotonic()
        took_over = False
        while time.monotonic() - started < deadline_s:
            try:
                if self.role(replica) == "master" and all(self._cluster_ok(p) for p in self._live()):
                    return
                if not took_over and time.monotonic() - started > 15:
                    client = self.node(replica)
                    client.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
                    client.close()
                    took_over = True
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"replica {replica} was not promoted within {deadline_s} s")

    def _live(self) -> list[int]:
        return [p for p in self.ports if p not in self.ports_dead and p not in self.stopped]

    def _cluster_ok(self, port: int) -> bool:
        client = self.node(port)
        try:
            return b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
        finally:
            client.close()
