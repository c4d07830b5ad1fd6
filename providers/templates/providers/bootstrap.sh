#!/bin/bash
# Veri worker bootstrap for {{ job_id }}, rendered by the control plane (providers/bootstrap.py)
# and run once by the machine's first boot (cloud-init user-data or a startup script).
# VERI_ROOT and VERI_SHUTDOWN exist for the bootstrap's own test; a rented machine has neither.
set -euo pipefail
root="${VERI_ROOT:-/opt/veri}"
mkdir -p "$root/work" "$root/mnt"
exec >>"$root/bootstrap.log" 2>&1
echo "[veri] bootstrap for {{ job_id }} at $(date -u +%FT%TZ)"

# The sandbox the worker runs customer code in (worker/sandbox.py): without it, it runs none.
command -v bwrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq bubblewrap; } || echo "[veri] could not install bubblewrap"

# The worker, pinned to the control plane's version, in its own environment.
python3 -m venv "$root/venv"
"$root/venv/bin/pip" install --quiet --disable-pip-version-check{% if index_url %} --index-url {{ index_url|shell }}{% endif %} {{ package|shell }}

# What the worker needs: the control plane's URL and this job's token (never an API key).
umask 077
cat >"$root/env" <<'VERI_ENV'
{% for name, value in env %}{{ name }}={{ value|shell }}
{% endfor %}VERI_ENV
set -a; . "$root/env"; set +a
export VERI_WORK_DIR="$root/work" VERI_MOUNT_ROOT="$root/mnt"

cd "$root/work"
status=0
"$root/venv/bin/python" -m worker run --job {{ job_id|shell }} --api {{ api_url|shell }} || status=$?
echo "[veri] worker exited with ${status}"
# The machine's last act: ask the control plane to delete it (POST …/release, with the job's
# current token, which the worker keeps in VERI_TOKEN_FILE when it renews it). A powered-off
# machine still bills on most providers; a deleted one does not. Honoured once the job has ended.
release_token="$(cat "${VERI_TOKEN_FILE:-$root/token}" 2>/dev/null || true)"
release_url={{ api_url|shell }}
release_url="${release_url%/}/v1/worker/jobs/"{{ job_id|shell }}"/release"
curl -sS -o /dev/null -w "[veri] release answered %{http_code}\n" -m 30 --retry 4 \
  --retry-delay 5 -X POST -H "Authorization: Bearer ${release_token:-${VERI_JOB_TOKEN:-}}" \
  "$release_url" || echo "[veri] release failed"
# The control plane terminates the machine; if it cannot, the machine ends itself within
# {{ self_stop_minutes }} minutes of the worker's end rather than renting on.
${VERI_SHUTDOWN:-shutdown} -h +{{ self_stop_minutes }}
