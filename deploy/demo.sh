#!/usr/bin/env bash
# Runs stream-dp end to end on this machine without Docker: installs what is
# missing, starts Kafka, Redis and Prometheus on loopback, starts a worker with
# deploy/queries.example.yaml, publishes a synthetic stream keyed by user, and
# prints the noisy releases as they come out. Services keep running afterwards
# (stop them with `bash deploy/services.sh stop`).
#   DEMO_EVENTS (300000)  DEMO_UNITS (20000)  DEMO_TAIL_IDLE_S (45: stop after this long without a release)
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

config="$here/queries.example.yaml"
.venv/bin/stream-dp check-config "$config"
.venv/bin/stream-dp plan "$config"

.venv/bin/stream-dp run --config "$config" > "$run_dir/worker.log" 2>&1 &
worker=$!
trap 'kill "$worker" 2>/dev/null; wait "$worker" 2>/dev/null || true' EXIT
echo "worker started (pid $worker, log $run_dir/worker.log, metrics http://127.0.0.1:9108/metrics)"

# One-minute windows: event times spread over the last few minutes so that
# several windows close right away; the newest closes after the idle timeout.
.venv/bin/stream-dp produce --topic events.pageviews --synthetic "${DEMO_EVENTS:-300000}" \
  --units "${DEMO_UNITS:-20000}" --time-step-ms 1 --config "$config" --query pageviews_by_page

echo "releases on dp.pageviews_by_page (noisy counts, sums and means with 95% half-widths):"
.venv/bin/stream-dp tail --topic dp.pageviews_by_page --from-beginning --timeout "${DEMO_TAIL_IDLE_S:-45}"
echo "budget of the most active users:"
.venv/bin/stream-dp budget top --config "$config" --namespace users -n 5 || true
