#!/usr/bin/env bash
# Runs stream-dp end to end on this machine without Docker: installs what is
# missing, starts Kafka, Redis and Prometheus on loopback, starts a worker with
# deploy/queries.example.yaml (or DEMO_CONFIG), publishes a live synthetic stream
# keyed by unit to every input topic of its queries (event times are the current
# time, so windows close as the demo runs; randomized at the producer for a
# local_dp query), and prints the first two windows each query releases.
# Services keep running afterwards (stop them with `bash deploy/services.sh stop`).
#   DEMO_RATE (2000 events per second per input topic)  DEMO_UNITS (20000)
#   DEMO_SECONDS (240: the most the producers run and the releases are waited for; they stop once
#   every query has printed its first two windows)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"

"$here/install.sh"
"$here/services.sh" start all
eval "$("$here/services.sh" env)"
run_dir="${STREAM_DP_RUN_DIR:-$repo/.run}"
mkdir -p "$run_dir"

# The contribution-sampling key must stay the same across restarts (replays
# must keep the same contributions): keep one per checkout.
if [ -z "${STREAM_DP_CONTRIBUTION_SECRET:-}" ]; then
  [ -f "$run_dir/contribution-secret" ] || .venv/bin/python -c 'import secrets; print(secrets.token_hex(32))' > "$run_dir/contribution-secret"
  export STREAM_DP_CONTRIBUTION_SECRET="$(cat "$run_dir/contribution-secret")"
fi

config="${DEMO_CONFIG:-$here/queries.example.yaml}"
.venv/bin/stream-dp check-config "$config"
.venv/bin/stream-dp plan "$config"

# A local_dp query's producer randomizes its reports from a secret of its own; keep one per checkout
# so that a re-run sends the same reports.
[ -f "$run_dir/local-dp-secret" ] || head -c 32 /dev/urandom > "$run_dir/local-dp-secret"

producers=()
stop_all() {
  for pid in "${producers[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -z "$worker" ] || kill "$worker" 2>/dev/null
  wait 2>/dev/null || true
}
worker=""
trap stop_all EXIT

# Per input topic: the local_dp query reading it (if any) and its field; per output topic: the
# query's window size.
read_config() {
  .venv/bin/python - "$config" "$1" <<'PY'
import sys
from stream_dp.config import format_duration_ms, load_config
queries = load_config(sys.argv[1]).queries
if sys.argv[2] == "inputs":
    for topic in dict.fromkeys(q.input_topic for q in queries):
        local = [q for q in queries if q.input_topic == topic and q.local_dp is not None]
        print(topic, local[0].name if local else "-", local[0].local_dp.field if local else "-")
elif sys.argv[2] == "lateness":
    print(-(-max(q.window.allowed_lateness_ms for q in queries) // 1000))
else:
    for q in queries:
        print(q.output_topic, q.name, format_duration_ms(q.window.size_ms))
PY
}
inputs="$(read_config inputs)"
outputs="$(read_config outputs)"

# Live events: each producer stamps its events with the current time and sends DEMO_RATE of them a
# second, so windows close as time passes, as they would on a live site.
rate="${DEMO_RATE:-2000}"
seconds="${DEMO_SECONDS:-240}"
while read -r topic local_query local_field; do
  options=(--topic "$topic" --synthetic "$((rate * seconds))" --rate "$rate" --units "${DEMO_UNITS:-20000}"
           --config "$config" --quiet)
  if [ "$local_query" != "-" ]; then
    options+=(--query "$local_query" --local-dp "$local_field" --local-dp-secret-file "$run_dir/local-dp-secret")
  fi
  .venv/bin/stream-dp produce "${options[@]}" > "$run_dir/producer-$topic.log" 2>&1 &
  producers+=($!)
  echo "publishing $rate live events a second to $topic (log $run_dir/producer-$topic.log)"
done <<< "$inputs"
# Started after the producers, so that the input topics are theirs to create, and once they have run
# for the queries' allowed_lateness: a query first run publishes from its start less allowed_lateness,
# so its second window then begins after the first event (a full window).
sleep "$(read_config lateness)"
.venv/bin/stream-dp run --config "$config" > "$run_dir/worker.log" 2>&1 &
worker=$!
echo "worker started (pid $worker, log $run_dir/worker.log, metrics http://127.0.0.1:${STREAM_DP_METRICS_PORT:-9108}/metrics)"

echo "[+${SECONDS} s] releases of each query's first two windows as they come out (noisy values with 95% half-widths;"
echo "the first window began before the events did, so it holds only part of a window's events: smaller values, the"
echo "same noise; the second is a full window):"
while read -r topic name window; do echo "  $topic: query $name, $window windows"; done <<< "$outputs"
# shellcheck disable=SC2046  # one --topic per output topic
.venv/bin/stream-dp tail $(while read -r topic _; do printf -- '--topic %s ' "$topic"; done <<< "$outputs") \
  --from-beginning --windows 2 --max-seconds "$seconds"
echo "[+${SECONDS} s] done"
for pid in "${producers[@]}"; do kill "$pid" 2>/dev/null || true; done

namespace="$(.venv/bin/python -c "import sys; from stream_dp.config import load_config; print(next(iter(load_config(sys.argv[1]).namespaces)))" "$config")"
echo "budget of the most active units of $namespace:"
.venv/bin/stream-dp budget top --config "$config" --namespace "$namespace" -n 5 || true
