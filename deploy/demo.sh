#!/usr/bin/env bash
# Runs stream-dp end to end on this machine without Docker: installs what is
# missing, starts Kafka, Redis and Prometheus on loopback, validates the example
# query file, then runs the worker on a synthetic stream and shows releases.
#   DEMO_EVENTS (200000)  DEMO_RATE (20000 events/s)  DEMO_SECONDS (90: how long the worker runs)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"

"$here/install.sh"
"$here/services.sh" start all
eval "$("$here/services.sh" env)"

config="$here/queries.example.yaml"
.venv/bin/stream-dp check-config "$config"
echo "services are up: Kafka $KAFKA_BOOTSTRAP_SERVERS, Redis $REDIS_URL, Prometheus $PROMETHEUS_URL"
echo "stop them with: bash deploy/services.sh stop"
