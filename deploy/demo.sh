#!/usr/bin/env bash
# Runs stream-dp end to end on this machine without Docker: installs what is
# missing, starts Kafka, Redis and Prometheus on loopback, starts a worker with
# deploy/queries.example.yaml (or DEMO_CONFIG), publishes a synthetic stream keyed
# by unit to every input topic of its queries (randomized at the producer for a
# local_dp query), and prints the noisy releases of every query as they come out.
# Services keep running afterwards (stop them with `bash deploy/services.sh stop`).
#   DEMO_EVENTS (300000 per input topic)  DEMO_UNITS (20000)
#   DEMO_TAIL_IDLE_S (45: stop tailing the first query after this long without a release)
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

.venv/bin/stream-dp run --config "$config" > "$run_dir/worker.log" 2>&1 &
worker=$!
trap 'kill "$worker" 2>/dev/null; wait "$worker" 2>/dev/null || true' EXIT
echo "worker started (pid $worker, log $run_dir/worker.log, metrics http://127.0.0.1:${STREAM_DP_METRICS_PORT:-9108}/metrics)"

# Per input topic: its longest window, and the local_dp query reading it (if any). Event times
# spread back from now over three of those windows (at least five minutes), so that at least
# two windows close right away; the newest closes after the idle timeout.
topics="$(.venv/bin/python - "$config" <<'PY'
import sys
from stream_dp.config import load_config
queries = load_config(sys.argv[1]).queries
for topic in dict.fromkeys(q.input_topic for q in queries):
    reading = [q for q in queries if q.input_topic == topic]
    local = [q for q in reading if q.local_dp is not None]
    window_ms = max(q.window.size_ms for q in reading)
    print(topic, window_ms, local[0].name if local else "-", local[0].local_dp.field if local else "-")
PY
)"
events="${DEMO_EVENTS:-300000}"
while read -r topic window_ms local_query local_field; do
  span_ms=$(( window_ms * 3 > 300000 ? window_ms * 3 : 300000 ))
  step_ms="$(.venv/bin/python -c "print($span_ms / $events)")"
  echo "publishing $events synthetic events to $topic (event times over the last $(( span_ms / 60000 )) minutes)"
  if [ "$local_query" = "-" ]; then
    .venv/bin/stream-dp produce --topic "$topic" --synthetic "$events" --units "${DEMO_UNITS:-20000}" \
      --time-step-ms "$step_ms" --config "$config" --quiet
  else
    .venv/bin/stream-dp produce --topic "$topic" --synthetic "$events" --units "${DEMO_UNITS:-20000}" \
      --time-step-ms "$step_ms" --config "$config" --query "$local_query" --quiet \
      --local-dp "$local_field" --local-dp-secret-file "$run_dir/local-dp-secret"
  fi
done <<< "$topics"

outputs="$(.venv/bin/python - "$config" <<'PY'
import sys
from stream_dp.config import load_config
for q in load_config(sys.argv[1]).queries:
    print(q.output_topic)
PY
)"
first="$(head -n 1 <<< "$outputs")"
echo "releases on $first (noisy values with 95% half-widths):"
.venv/bin/stream-dp tail --topic "$first" --from-beginning --timeout "${DEMO_TAIL_IDLE_S:-45}"
for topic in $(tail -n +2 <<< "$outputs"); do
  echo "releases on $topic (the first ones):"
  .venv/bin/stream-dp tail --topic "$topic" --from-beginning --max 6 --timeout 20
done
namespace="$(.venv/bin/python -c "import sys; from stream_dp.config import load_config; print(next(iter(load_config(sys.argv[1]).namespaces)))" "$config")"
echo "budget of the most active units of $namespace:"
.venv/bin/stream-dp budget top --config "$config" --namespace "$namespace" -n 5 || true
