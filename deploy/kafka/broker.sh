#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft) on loopback, from Maven Central jars.
#
#   deploy/kafka/broker.sh fetch    resolve the broker jars into the cache (Maven)
#   deploy/kafka/broker.sh start    fetch if needed, format storage once, start, wait until ready
#   deploy/kafka/broker.sh stop     stop the broker started from this run directory
#   deploy/kafka/broker.sh status   exit 0 when the broker answers
#
# Environment: KAFKA_PORT (9092), KAFKA_CONTROLLER_PORT (9093), KAFKA_HEAP (512m),
# STREAM_DP_RUN_DIR (repo/.run: data, logs, pid), STREAM_DP_CACHE (~/.cache/stream-dp: jars),
# PYTHON (the project's venv python, used for the readiness check).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
port="${KAFKA_PORT:-9092}"
controller_port="${KAFKA_CONTROLLER_PORT:-9093}"
heap="${KAFKA_HEAP:-512m}"
run_dir="${STREAM_DP_RUN_DIR:-$repo/.run}/kafka"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
cache="${STREAM_DP_CACHE:-$HOME/.cache/stream-dp}/kafka-$version"
python="${PYTHON:-$repo/.venv/bin/python}"
bootstrap="127.0.0.1:$port"

log() { echo "[kafka] $*" >&2; }

fetch() {
  if [ -f "$cache/lib/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || { log "Maven (mvn) is needed to fetch the broker jars: install it (apt-get install maven)"; exit 1; }
  command -v java >/dev/null || { log "Java 17+ is needed to run the broker: install it (apt-get install openjdk-17-jre-headless)"; exit 1; }
  log "fetching kafka_2.13 $version and its dependencies into $cache/lib"
  rm -rf "$cache/lib"
  mkdir -p "$cache/lib"
  mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$cache/lib"
  touch "$cache/lib/.complete"
}

ready() { "$python" "$here/wait_ready.py" "$bootstrap" "${1:-2}" 2>/dev/null; }

running_pid() {
  local pid_file="$run_dir/kafka.pid"
  [ -f "$pid_file" ] || return 1
  local pid; pid="$(cat "$pid_file")"
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

write_properties() {
  mkdir -p "$run_dir/data"
  cat > "$run_dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$run_dir/data
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
log.retention.hours=24
log.segment.bytes=67108864
PROPS
}

start() {
  if pid="$(running_pid)"; then
    if ready 30; then log "already running (pid $pid) on $bootstrap"; return 0; fi
    log "pid $pid exists but the broker does not answer; stop it first (deploy/kafka/broker.sh stop)"; exit 1
  fi
  if ready 1; then log "a broker already answers on $bootstrap (not started by this run directory); using it"; return 0; fi
  fetch
  write_properties
  local jvm=(java "-Xmx$heap" "-Xms128m" -XX:+UseG1GC -Djava.awt.headless=true
             "-Dlog4j2.configurationFile=$here/log4j2.properties" -cp "$cache/lib/*")
  if [ ! -f "$run_dir/data/meta.properties" ]; then
    local cluster_id; cluster_id="$("${jvm[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
    "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$run_dir/server.properties" \
      > "$run_dir/format.log" 2>&1 || { log "formatting storage failed: see $run_dir/format.log"; exit 1; }
  fi
  local t0; t0=$(date +%s%N)
  nohup "${jvm[@]}" kafka.Kafka "$run_dir/server.properties" > "$run_dir/kafka.log" 2>&1 &
  echo $! > "$run_dir/kafka.pid"
  if ! ready 90; then
    log "broker did not become ready within 90s; last log lines:"; tail -20 "$run_dir/kafka.log" >&2
    stop; exit 1
  fi
  log "ready on $bootstrap after $(( ($(date +%s%N) - t0) / 1000000 )) ms (pid $(cat "$run_dir/kafka.pid"), Kafka $version)"
}

stop() {
  local pid
  if ! pid="$(running_pid)"; then rm -f "$run_dir/kafka.pid"; return 0; fi
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then log "broker did not stop in 20s; killing"; kill -9 "$pid" 2>/dev/null || true; fi
  rm -f "$run_dir/kafka.pid"
  log "stopped"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) if ready 2; then log "answers on $bootstrap"; else log "not answering on $bootstrap"; exit 1; fi ;;
  *) echo "usage: $0 {fetch|start|stop|status}" >&2; exit 2 ;;
esac
