#!/usr/bin/env bash
# Runs the whole test suite against real services, on a new machine too:
# installs what is missing, starts Kafka, Redis, a Redis Cluster and Prometheus on loopback,
# runs pytest (extra arguments are passed to it) in several processes, and stops what it started.
# STREAM_DP_FULL_TESTS=1 runs the full suite (tests/conftest.py says what it adds).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"

"$here/install.sh"

started=()
cleanup() {
  for service in "${started[@]}"; do "$here/services.sh" stop "$service" || true; done
}
trap cleanup EXIT

# Redis as deployed (append-only file fsynced on every write), with its files on a tmpfs when there is one:
# on a disk each of the suite's many small writes waits for an fsync (measured here: 2,100 SETs/s with
# waits up to 25 ms beside a busy suite, against 13,500/s on /dev/shm; the neighbouring-stream audit of
# 200 windows took 238 s, 162 s on /dev/shm). Fault runs that crash Redis start servers of their own, on disk.
if [ -z "${STREAM_DP_REDIS_DATA_DIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  export STREAM_DP_REDIS_DATA_DIR="/dev/shm/stream-dp-test-redis-$(id -u)"
fi
eval "$("$here/services.sh" env)"
# Services already running (a developer's own) are used and left running.
for service in redis redis-cluster prometheus kafka; do
  case "$service" in
    redis) redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && continue ;;
    redis-cluster) redis-cli -h 127.0.0.1 -p "${REDIS_CLUSTER_PORT:-7300}" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && continue ;;
    prometheus) curl -fsS "$PROMETHEUS_URL/-/ready" >/dev/null 2>&1 && continue ;;
    kafka) "$here/kafka/broker.sh" status >/dev/null 2>&1 && continue ;;
  esac
  "$here/services.sh" start "$service"
  started+=("$service")
done

# Several pytest processes (pytest-xdist): most of the suite waits -- for windows to close, brokers to
# return, worker processes to join -- so a few processes share two cores well (tests/scheduling.py says
# which tests keep together and what starts first). Arguments given here come after, so `-n 0` runs one.
.venv/bin/python -m pytest -n "${STREAM_DP_TEST_PROCESSES:-3}" --dist loadgroup "$@"
