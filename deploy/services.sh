#!/usr/bin/env bash
# Local services on loopback, without Docker: Apache Kafka (KRaft, Maven jars),
# Redis and Prometheus (Debian packages).
#
#   deploy/services.sh start [kafka|kafka-secure|redis|redis-cluster|prometheus|all]   idempotent: finds running ones
#   deploy/services.sh stop  [kafka|kafka-secure|redis|redis-cluster|prometheus|all]
#   deploy/services.sh status
#   deploy/services.sh env        print the variables clients need (eval "$(deploy/services.sh env)")
#
# Ports: KAFKA_PORT (9092), REDIS_PORT (6379), PROMETHEUS_PORT (9090); the Redis Cluster
# (3 masters + 3 replicas, Debian's redis-server) takes REDIS_CLUSTER_PORT (7300) to +5,
# and those plus 10000 for its cluster bus.
# kafka-secure (not in "all") is a second, separate broker that authenticates (SASL/SCRAM) and authorizes
# (StandardAuthorizer, allow.everyone.if.no.acl.found=false) every client, on KAFKA_SECURE_PORT (9192) and
# KAFKA_SECURE_CONTROLLER_PORT (9193) with its own data directory; KAFKA_SCRAM_USERS ("worker=pw,...")
# are its users, KAFKA_ADMIN_PASSWORD its super user's password (else generated: see deploy/kafka/broker.sh).
# State, logs and pid files live under STREAM_DP_RUN_DIR (default: repo/.run, git-ignored).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
run_dir="${STREAM_DP_RUN_DIR:-$repo/.run}"
# Where Redis and the Redis Cluster keep their append-only files and pid files (default: the run directory).
# deploy/test.sh puts them on a tmpfs: see there why.
redis_data_dir="${STREAM_DP_REDIS_DATA_DIR:-$run_dir}"
redis_port="${REDIS_PORT:-6379}"
prom_port="${PROMETHEUS_PORT:-9090}"
cluster_port="${REDIS_CLUSTER_PORT:-7300}"
cluster_ports=$(seq "$cluster_port" $((cluster_port + 5)))
secure_port="${KAFKA_SECURE_PORT:-9192}"
secure_controller_port="${KAFKA_SECURE_CONTROLLER_PORT:-9193}"
secure_kafka() { KAFKA_AUTH=scram KAFKA_PORT="$secure_port" KAFKA_CONTROLLER_PORT="$secure_controller_port" "$here/kafka/broker.sh" "$@"; }
export STREAM_DP_RUN_DIR="$run_dir"

log() { echo "[services] $*" >&2; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

redis_ping() { redis-cli -h 127.0.0.1 -p "$redis_port" ping 2>/dev/null | grep -q PONG; }

start_redis() {
  command -v redis-server >/dev/null || { log "redis-server is missing: run deploy/install.sh (apt-get install redis-server)"; exit 1; }
  if redis_ping; then log "redis already answers on 127.0.0.1:$redis_port"; return 0; fi
  mkdir -p "$redis_data_dir/redis"
  # The budget store and release ledger must survive a Redis restart and never be
  # evicted: append-only file fsynced on every write, no eviction.
  redis-server --port "$redis_port" --bind 127.0.0.1 --protected-mode yes \
    --dir "$redis_data_dir/redis" --appendonly yes --appendfsync always --maxmemory-policy noeviction --lazyfree-lazy-expire yes --save "" \
    --daemonize yes --pidfile "$redis_data_dir/redis/redis.pid" --logfile "$redis_data_dir/redis/redis.log"
  wait_for_redis "$redis_port" "$redis_data_dir/redis"
}

# A Redis with a large append-only file answers LOADING for as long as it reads it back
# (seconds per GB): that is a Redis starting, not a failure, so wait while its process lives.
redis_loading() { redis-cli -h 127.0.0.1 -p "$1" ping 2>&1 | grep -q LOADING; }

wait_for_redis() {
  local port="$1" dir="$2" waited=0
  for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  while redis_loading "$port" && pid_alive "$dir/redis.pid" && [ "$waited" -lt "${REDIS_LOAD_TIMEOUT_S:-900}" ]; do
    [ $((waited % 10)) -eq 0 ] && log "redis on 127.0.0.1:$port is loading its append-only file (${waited} s so far)"
    sleep 1; waited=$((waited + 1))
  done
  redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG \
    || { log "redis on 127.0.0.1:$port did not answer; see $dir/redis.log (a large append-only file may need more than REDIS_LOAD_TIMEOUT_S=${REDIS_LOAD_TIMEOUT_S:-900} s)"; exit 1; }
  log "redis ready on 127.0.0.1:$port"
}

stop_redis() {
  if pid_alive "$redis_data_dir/redis/redis.pid"; then
    redis-cli -h 127.0.0.1 -p "$redis_port" shutdown nosave >/dev/null 2>&1 || kill "$(cat "$redis_data_dir/redis/redis.pid")" || true
    for _ in $(seq 1 50); do pid_alive "$redis_data_dir/redis/redis.pid" || break; sleep 0.1; done
    log "redis stopped"
  fi
  rm -f "$redis_data_dir/redis/redis.pid"
}

cluster_ok() { redis-cli -h 127.0.0.1 -p "$cluster_port" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }
node_ping() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }
# Nodes that know only themselves: started, never joined to a cluster.
node_alone() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | grep -q '^cluster_known_nodes:1\b'; }

# Every master has a replica online and every replica's link is up: charges wait for one.
node_synced() {
  local info; info="$(redis-cli -h 127.0.0.1 -p "$1" info replication 2>/dev/null | tr -d '\r')"
  case "$info" in
    *role:master*) grep -q '^slave0:.*state=online' <<<"$info" ;;
    *role:slave*) grep -q '^master_link_status:up' <<<"$info" ;;
    *) return 1 ;;
  esac
}
cluster_synced() { local port; for port in $cluster_ports; do node_synced "$port" || return 1; done; }

start_redis_cluster() {
  command -v redis-server >/dev/null || { log "redis-server is missing: run deploy/install.sh (apt-get install redis-server)"; exit 1; }
  local dir="$redis_data_dir/redis-cluster" port alone=0
  # Every node not answering is started, also when the cluster answers without it (a node
  # killed by a test or a crash rejoins with its nodes.conf, as a replica if it was failed over).
  for port in $cluster_ports; do
    node_ping "$port" && continue
    mkdir -p "$dir/$port"
    # As the single Redis: AOF fsynced on every write, no eviction. A short node timeout
    # makes a replica take over from a dead master within seconds.
    redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes --dir "$dir/$port" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout "${REDIS_CLUSTER_NODE_TIMEOUT_MS:-2000}" \
      --appendonly yes --appendfsync always --maxmemory-policy noeviction --lazyfree-lazy-expire yes --save "" \
      --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log"
  done
  for port in $cluster_ports; do
    for _ in $(seq 1 50); do node_ping "$port" && break; sleep 0.1; done
    node_ping "$port" || { log "redis on $port did not answer; see $dir/$port/redis.log"; exit 1; }
    if node_alone "$port"; then alone=$((alone + 1)); fi
  done
  if [ "$alone" = 6 ]; then
    local nodes=()
    for port in $cluster_ports; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 \
      || { log "redis-cli --cluster create failed; see $dir/create.log"; exit 1; }
  elif [ "$alone" != 0 ]; then
    log "$alone of the 6 nodes on ports $cluster_port-$((cluster_port + 5)) belong to no cluster and the others do;"
    log "run '$0 stop redis-cluster', remove $dir and start again (this forgets the cluster's data)"
    exit 1
  fi
  for _ in $(seq 1 150); do cluster_ok && break; sleep 0.2; done
  cluster_ok || { log "redis cluster did not reach cluster_state:ok; see $dir/*/redis.log"; exit 1; }
  for _ in $(seq 1 150); do cluster_synced && break; sleep 0.2; done
  cluster_synced || { log "redis cluster replicas did not come online; see $dir/*/redis.log"; exit 1; }
  log "redis cluster ready on 127.0.0.1:$cluster_port-$((cluster_port + 5))"
}

stop_redis_cluster() {
  local dir="$redis_data_dir/redis-cluster" stopped=0
  for port in $cluster_ports; do
    if pid_alive "$dir/$port/redis.pid"; then
      redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$(cat "$dir/$port/redis.pid")" || true
      for _ in $(seq 1 50); do pid_alive "$dir/$port/redis.pid" || break; sleep 0.1; done
      stopped=1
    fi
    rm -f "$dir/$port/redis.pid"
  done
  [ "$stopped" = 0 ] || log "redis cluster stopped"
}

prom_ready() { curl -fsS "http://127.0.0.1:$prom_port/-/ready" >/dev/null 2>&1; }

start_prometheus() {
  command -v prometheus >/dev/null || { log "prometheus is missing: run deploy/install.sh (apt-get install prometheus)"; exit 1; }
  if prom_ready; then log "prometheus already answers on 127.0.0.1:$prom_port"; return 0; fi
  mkdir -p "$run_dir/prometheus/data"
  nohup prometheus --config.file="$here/prometheus/prometheus.local.yml" \
    --storage.tsdb.path="$run_dir/prometheus/data" \
    --web.listen-address="127.0.0.1:$prom_port" --web.enable-lifecycle \
    > "$run_dir/prometheus/prometheus.log" 2>&1 &
  echo $! > "$run_dir/prometheus/prometheus.pid"
  for _ in $(seq 1 100); do prom_ready && break; sleep 0.2; done
  prom_ready || { log "prometheus did not become ready; see $run_dir/prometheus/prometheus.log"; exit 1; }
  log "prometheus ready on 127.0.0.1:$prom_port"
}

stop_prometheus() {
  local pid_file="$run_dir/prometheus/prometheus.pid"
  if pid_alive "$pid_file"; then
    kill "$(cat "$pid_file")"
    for _ in $(seq 1 100); do pid_alive "$pid_file" || break; sleep 0.1; done
    log "prometheus stopped"
  fi
  rm -f "$pid_file"
}

what="${2:-all}"
case "${1:-}" in
  start)
    case "$what" in
      kafka) "$here/kafka/broker.sh" start ;;
      kafka-secure) secure_kafka start ;;
      redis) start_redis ;;
      redis-cluster) start_redis_cluster ;;
      prometheus) start_prometheus ;;
      all) start_redis; start_redis_cluster; start_prometheus; "$here/kafka/broker.sh" start ;;
      *) log "unknown service '$what': use kafka, kafka-secure, redis, redis-cluster, prometheus or all"; exit 2 ;;
    esac ;;
  stop)
    case "$what" in
      kafka) "$here/kafka/broker.sh" stop ;;
      kafka-secure) secure_kafka stop ;;
      redis) stop_redis ;;
      redis-cluster) stop_redis_cluster ;;
      prometheus) stop_prometheus ;;
      all) "$here/kafka/broker.sh" stop; stop_prometheus; stop_redis_cluster; stop_redis ;;
      *) log "unknown service '$what': use kafka, kafka-secure, redis, redis-cluster, prometheus or all"; exit 2 ;;
    esac ;;
  status)
    rc=0
    "$here/kafka/broker.sh" status || rc=1
    if redis_ping; then log "redis answers on 127.0.0.1:$redis_port"; else log "redis not answering"; rc=1; fi
    if cluster_ok; then log "redis cluster answers on 127.0.0.1:$cluster_port"; else log "redis cluster not answering"; rc=1; fi
    if prom_ready; then log "prometheus answers on 127.0.0.1:$prom_port"; else log "prometheus not answering"; rc=1; fi
    exit $rc ;;
  env)
    echo "export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:${KAFKA_PORT:-9092}"
    echo "export KAFKA_SECURE_BOOTSTRAP_SERVERS=127.0.0.1:$secure_port"
    echo "export REDIS_URL=redis://127.0.0.1:$redis_port/0"
    echo "export REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:$cluster_port,127.0.0.1:$((cluster_port + 1)),127.0.0.1:$((cluster_port + 2))"
    echo "export PROMETHEUS_URL=http://127.0.0.1:$prom_port"
    echo "export PROMTOOL=$(command -v promtool || echo promtool)"
    echo "export PROMETHEUS=$(command -v prometheus || echo prometheus)" ;;
  *) echo "usage: $0 {start|stop|status|env} [kafka|kafka-secure|redis|redis-cluster|prometheus|all]" >&2; exit 2 ;;
esac
