#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL cluster and an S3 API server (moto) on loopback,
# then stop both. Exports DATABASE_URL and VERI_TEST_S3_URL to the command. Installs PostgreSQL,
# Redis (the production topology starts its own) and Chromium (for the browser tests) from
# Debian's packages when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}

free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
  echo "Installing PostgreSQL (apt-get)…" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

if ! command -v redis-server >/dev/null; then  # the production topology's task broker
  echo "Installing Redis (apt-get)…" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi

if [ "$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then  # the worker's sandbox, as root
  echo "Installing bubblewrap (apt-get)…" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi

if [ ! -x /usr/bin/chromium ]; then  # the browser tests drive Debian's Chromium with Playwright
  echo "Installing Chromium (apt-get)…" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

mkdir -p .veri
run_dir=$(mktemp -d "$PWD/.veri/services.XXXXXX")
chmod 755 "$run_dir"
pg_port=$(free_port)
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres "$run_dir"; fi

cleanup() {
  as_pg "$pg_bin/pg_ctl -D $run_dir/pg -m immediate -w stop" >/dev/null 2>&1 || true
  [ -n "${moto_pid:-}" ] && kill "$moto_pid" 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT INT TERM

as_pg "$pg_bin/initdb -D $run_dir/pg -A trust -U postgres" >/dev/null
as_pg "$pg_bin/pg_ctl -D $run_dir/pg -l $run_dir/pg.log -w start -o \"-p $pg_port -k $run_dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200\"" >/dev/null

moto_port=$(free_port)
"$venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >"$run_dir/moto.log" 2>&1 &
moto_pid=$!
for _ in $(seq 100); do
  "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$moto_port/moto-api/')" 2>/dev/null && break
  sleep 0.1
done

export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export VERI_TEST_S3_URL="http://127.0.0.1:$moto_port"
"$@"
