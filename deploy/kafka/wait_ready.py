"""Exit 0 once every Kafka broker of a bootstrap list is registered and unfenced, 1 after the deadline.

Used by broker.sh: a listening port is not enough -- a KRaft broker accepts
connections before its metadata is loaded and would then fail topic creation;
a cluster is ready when all its brokers are (replicated topics need them).
A broker that authenticates its clients (``broker.sh`` with ``KAFKA_AUTH=scram``) is asked as the user
WAIT_READY_SASL_USERNAME with WAIT_READY_SASL_PASSWORD, over SASL_PLAINTEXT with SCRAM-SHA-512.
"""

import os
import socket
import sys
import time
import warnings

DEADLINE_S = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0


def _security() -> dict:
    user = os.environ.get("WAIT_READY_SASL_USERNAME")
    if not user:
        return {}
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user,
            "sasl_plain_password": os.environ.get("WAIT_READY_SASL_PASSWORD", "")}


def main() -> int:
    bootstrap = sys.argv[1]
    servers = bootstrap.split(",")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kafka-python 3.x warns on import
        from kafka import KafkaAdminClient

    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        # The admin client blocks for its whole bootstrap timeout when nothing
        # listens, so look for an open port first.
        try:
            for server in servers:
                host, _, port = server.rpartition(":")
                socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            time.sleep(0.3)
            continue
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, **_security())
            try:
                brokers = admin.describe_cluster()["brokers"]
            finally:
                admin.close()
            if len(brokers) >= len(servers) and not any(b.get("is_fenced") for b in brokers):
                return 0
        except Exception:
            pass
        time.sleep(0.3)
    print(f"Kafka at {bootstrap} did not answer a metadata request within {DEADLINE_S:.0f}s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
