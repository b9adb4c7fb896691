#!/usr/bin/env bash
# Installs everything stream-dp needs on a new Debian/Ubuntu machine, idempotently:
#   - Debian packages: redis-server, prometheus (brings promtool), curl; Java 17 and Maven if missing
#   - the Python virtualenv .venv with `pip install -e .[dev]` (re-run only when pyproject.toml changes)
#   - the Apache Kafka broker jars from Maven Central (deploy/kafka/broker.sh fetch)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${STREAM_DP_VENV:-$repo/.venv}"
python_bin="${PYTHON_BIN:-python3}"

log() { echo "[install] $*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else log "need root (or sudo) to run: $*"; exit 1; fi
}

apt_packages=()
command -v redis-server >/dev/null || apt_packages+=(redis-server)
command -v redis-cli >/dev/null || apt_packages+=(redis-tools)
command -v prometheus >/dev/null || apt_packages+=(prometheus)
command -v promtool >/dev/null || apt_packages+=(prometheus)
command -v curl >/dev/null || apt_packages+=(curl)
command -v java >/dev/null || apt_packages+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || apt_packages+=(maven)
if [ ${#apt_packages[@]} -gt 0 ]; then
  log "apt-get install ${apt_packages[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi
# Debian's packages start their own services where an init system runs; the
# project starts its own on loopback with its own data directories instead.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  as_root systemctl stop redis-server prometheus >/dev/null 2>&1 || true
fi

"$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { log "Python >= 3.11 is needed (set PYTHON_BIN to one)"; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  log "creating virtualenv $venv"
  "$python_bin" -m venv "$venv"
fi
stamp="$venv/.stream-dp-installed"
want="$(cat "$repo/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "pip install -e .[dev]"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$repo[dev]"
  echo "$want" > "$stamp"
fi

PYTHON="$venv/bin/python" "$here/kafka/broker.sh" fetch
log "done"
