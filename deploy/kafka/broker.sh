#!/usr/bin/env bash
# An Apache Kafka broker (KRaft) on loopback from Maven Central jars: one node, or a cluster of
# KAFKA_NODES nodes (each broker and controller, one quorum) for replication and failover tests.
#
#   deploy/kafka/broker.sh fetch          resolve the broker jars into the cache (Maven)
#   deploy/kafka/broker.sh start          fetch if needed, format storage once, start every node, wait until ready
#   deploy/kafka/broker.sh stop           stop every node started from this run directory
#   deploy/kafka/broker.sh status         exit 0 when the cluster answers
#   deploy/kafka/broker.sh bootstrap      print the bootstrap servers
#   deploy/kafka/broker.sh kill-node N    kill -9 node N (a host failure); start-node N brings it back
#
# Environment: KAFKA_NODES (1), KAFKA_PORT (9092: node N listens on KAFKA_PORT + 10 (N-1)),
# KAFKA_CONTROLLER_PORT (9093, likewise), KAFKA_HEAP (512m per node),
# STREAM_DP_RUN_DIR (repo/.run: data, logs, pid), STREAM_DP_CACHE (~/.cache/stream-dp: jars),
# PYTHON (the project's venv python, used for the readiness check).
#
# KAFKA_AUTH=scram starts a broker that authenticates and authorizes every client, in a data directory of
# its own (kafka-scram): clients connect over SASL_PLAINTEXT with SCRAM-SHA-256 or SCRAM-SHA-512, KRaft's
# StandardAuthorizer allows only what an ACL grants (allow.everyone.if.no.acl.found=false), and the admin
# user (KAFKA_ADMIN_USER, default admin; KAFKA_ADMIN_PASSWORD, else one generated into the data directory's
# admin.password) is the only super user, also for the controller listener (SASL/PLAIN). KAFKA_SCRAM_USERS
# ("worker=pw,producer=pw") are the users whose SCRAM credentials are written when the storage is formatted
# (kafka-storage format --add-scram), before the broker first starts. docs/operations/security.md
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
nodes="${KAFKA_NODES:-1}"
base_port="${KAFKA_PORT:-9092}"
base_controller_port="${KAFKA_CONTROLLER_PORT:-9093}"
heap="${KAFKA_HEAP:-512m}"
auth="${KAFKA_AUTH:-none}"
case "$auth" in none) flavour="" ;; scram) flavour="-scram" ;;
  *) echo "[kafka] KAFKA_AUTH=$auth: use none (the default) or scram" >&2; exit 2 ;; esac
# One node keeps the historical layout (.run/kafka); a cluster gets a directory per node; a broker with
# an authorizer never shares a data directory with one without.
if [ "$nodes" = 1 ]; then cluster_dir="${STREAM_DP_RUN_DIR:-$repo/.run}/kafka$flavour"
else cluster_dir="${STREAM_DP_RUN_DIR:-$repo/.run}/kafka$flavour-$nodes-nodes"; fi
admin_user="${KAFKA_ADMIN_USER:-admin}"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
cache="${STREAM_DP_CACHE:-$HOME/.cache/stream-dp}/kafka-$version"
python="${PYTHON:-$repo/.venv/bin/python}"
node_port() { echo $(( base_port + 10 * ($1 - 1) )); }
node_controller_port() { echo $(( base_controller_port + 10 * ($1 - 1) )); }
node_dir() { if [ "$nodes" = 1 ]; then echo "$cluster_dir"; else echo "$cluster_dir/node$1"; fi; }
bootstrap="$(for n in $(seq 1 "$nodes"); do printf '127.0.0.1:%s,' "$(node_port "$n")"; done)"
bootstrap="${bootstrap%,}"
voters="$(for n in $(seq 1 "$nodes"); do printf '%s@127.0.0.1:%s,' "$n" "$(node_controller_port "$n")"; done)"
voters="${voters%,}"
replication=$(( nodes < 3 ? nodes : 3 ))
min_isr=$(( replication > 1 ? 2 : 1 ))

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

# The admin's password: KAFKA_ADMIN_PASSWORD, else the one generated (once) into the data directory.
admin_password() {
  if [ -n "${KAFKA_ADMIN_PASSWORD:-}" ]; then echo "$KAFKA_ADMIN_PASSWORD"; return 0; fi
  local file="$cluster_dir/admin.password"
  if [ ! -s "$file" ]; then
    mkdir -p "$cluster_dir"
    (umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$file")
  fi
  cat "$file"
}

ready() {
  if [ "$auth" = scram ]; then
    WAIT_READY_SASL_USERNAME="$admin_user" WAIT_READY_SASL_PASSWORD="$(admin_password)" \
      "$python" "$here/wait_ready.py" "$bootstrap" "${1:-2}" 2>/dev/null
  else "$python" "$here/wait_ready.py" "$bootstrap" "${1:-2}" 2>/dev/null; fi
}

running_pid() {
  local pid_file; pid_file="$(node_dir "${1:-1}")/kafka.pid"
  [ -f "$pid_file" ] || return 1
  local pid; pid="$(cat "$pid_file")"
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

write_properties() {
  local n="$1" dir; dir="$(node_dir "$1")"
  local port; port="$(node_port "$n")"
  local controller_port; controller_port="$(node_controller_port "$n")"
  mkdir -p "$dir/data"
  (umask 077; : > "$dir/server.properties")  # with an authorizer it holds the admin's password
  {
  if [ "$auth" = scram ]; then
    local password; password="$(admin_password)"
    cat <<PROPS
listeners=SASL_PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$admin_user" password="$password";
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$admin_user" password="$password";
# SCRAM credentials live in the metadata log, which a controller reads only once it runs: the controller
# listener takes PLAIN with the admin alone
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="$admin_user" password="$password" user_$admin_user="$password";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:$admin_user
PROPS
  else
    cat <<PROPS
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
PROPS
  fi
  cat <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
log.dirs=$dir/data
num.partitions=1
default.replication.factor=$replication
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$replication
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$replication
transaction.state.log.min.isr=$min_isr
share.coordinator.state.topic.replication.factor=$replication
share.coordinator.state.topic.min.isr=$min_isr
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
log.retention.hours=24
log.segment.bytes=67108864
PROPS
  } >> "$dir/server.properties"
}

scram_users() { echo "$admin_user=$(admin_password)" $(tr ',' ' ' <<<"${KAFKA_SCRAM_USERS:-}"); }

check_scram_users() {
  local entry
  for entry in $(scram_users); do
    if [ -z "${entry%%=*}" ] || [ "${entry%%=*}" = "$entry" ] || [ -z "${entry#*=}" ]; then
      log "KAFKA_SCRAM_USERS takes name=password pairs separated by commas, got '$entry'"; exit 2
    fi
  done
}

# --add-scram arguments of kafka-storage format: the admin and every KAFKA_SCRAM_USERS user, both mechanisms.
scram_arguments() {
  local entry name password
  for entry in $(scram_users); do
    name="${entry%%=*}"; password="${entry#*=}"
    printf -- '--add-scram\nSCRAM-SHA-256=[name=%s,password=%s]\n--add-scram\nSCRAM-SHA-512=[name=%s,password=%s]\n' \
      "$name" "$password" "$name" "$password"
  done
}

jvm=(java "-Xmx$heap" "-Xms128m" -XX:+UseG1GC -Djava.awt.headless=true
     "-Dlog4j2.configurationFile=$here/log4j2.properties" -cp "$cache/lib/*")

# Format every node's storage with one cluster id (once), write its properties.
prepare() {
  fetch
  local cluster_id=""
  for n in $(seq 1 "$nodes"); do
    write_properties "$n"
    local dir; dir="$(node_dir "$n")"
    [ -f "$dir/data/meta.properties" ] && continue
    if [ -z "$cluster_id" ]; then
      cluster_id="$(cat "$cluster_dir/cluster.id" 2>/dev/null || true)"
      if [ -z "$cluster_id" ]; then
        cluster_id="$("${jvm[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
        mkdir -p "$cluster_dir" && echo "$cluster_id" > "$cluster_dir/cluster.id"
      fi
    fi
    local scram=()
    if [ "$auth" = scram ]; then check_scram_users; mapfile -t scram < <(scram_arguments); fi
    "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" "${scram[@]}" \
      > "$dir/format.log" 2>&1 || { log "formatting storage failed: see $dir/format.log"; exit 1; }
  done
}

start_node() {
  local n="$1" dir; dir="$(node_dir "$1")"
  if running_pid "$n" >/dev/null; then return 0; fi
  nohup "${jvm[@]}" kafka.Kafka "$dir/server.properties" > "$dir/kafka.log" 2>&1 &
  echo $! > "$dir/kafka.pid"
}

start() {
  if pid="$(running_pid 1)"; then
    if ready 30; then log "already running (pid $pid) on $bootstrap"; return 0; fi
    log "pid $pid exists but the broker does not answer; stop it first (deploy/kafka/broker.sh stop)"; exit 1
  fi
  if ready 1; then log "a broker already answers on $bootstrap (not started by this run directory); using it"; return 0; fi
  prepare
  local t0; t0=$(date +%s%N)
  for n in $(seq 1 "$nodes"); do start_node "$n"; done
  if ! ready 90; then
    log "broker did not become ready within 90s; last log lines:"
    for n in $(seq 1 "$nodes"); do tail -20 "$(node_dir "$n")/kafka.log" >&2; done
    stop; exit 1
  fi
  log "ready on $bootstrap after $(( ($(date +%s%N) - t0) / 1000000 )) ms (pid $(cat "$(node_dir 1)/kafka.pid"), Kafka $version, $nodes node(s))"
}

stop_node() {
  local n="$1" signal="${2:-TERM}" pid dir; dir="$(node_dir "$1")"
  if ! pid="$(running_pid "$n")"; then rm -f "$dir/kafka.pid"; return 0; fi
  kill "-$signal" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then log "node $n did not stop in 20s; killing"; kill -9 "$pid" 2>/dev/null || true; fi
  rm -f "$dir/kafka.pid"
}

stop() {
  local any="" pid
  # Signal every node first: a node waiting for a controller quorum that is already gone would not stop.
  for n in $(seq 1 "$nodes"); do if pid="$(running_pid "$n")"; then any=1; kill "$pid" 2>/dev/null || true; fi; done
  for n in $(seq 1 "$nodes"); do stop_node "$n"; done
  [ -n "$any" ] && log "stopped"
  return 0
}

node_arg() {
  local n="${1:-}"
  if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt "$nodes" ]; then
    log "give a node number from 1 to $nodes (KAFKA_NODES), got '${n}'"; exit 2
  fi
  echo "$n"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) if ready 2; then log "answers on $bootstrap"; else log "not answering on $bootstrap"; exit 1; fi ;;
  bootstrap) echo "$bootstrap" ;;
  kill-node) n="$(node_arg "${2:-}")"; stop_node "$n" KILL; log "node $n killed" ;;
  start-node) n="$(node_arg "${2:-}")"; fetch; write_properties "$n"; start_node "$n"; log "node $n started" ;;
  *) echo "usage: $0 {fetch|start|stop|status|bootstrap|kill-node N|start-node N}" >&2; exit 2 ;;
esac
