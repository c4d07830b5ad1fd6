#!/bin/bash
# Veri worker bootstrap for {{ job_id }} ({{ kind }}), rendered by the control plane (providers/bootstrap.py)
# and run once by the machine's first boot (cloud-init user-data or a startup script). It needs
# only bash, coreutils and curl (apt-get installs curl where an image lacks it): the installer
# (uv), the worker and its dependencies come from the control plane (providers/worker_dist.py),
# and uv finds or downloads the Python they need, whatever the image's own is.
# VERI_ROOT and VERI_SHUTDOWN exist for the bootstrap's own test; a rented machine has neither.
set -euo pipefail
root="${VERI_ROOT:-/opt/veri}"
api={{ api_url|shell }}
job={{ job_id|shell }}
routes="$api/v1/worker/{{ kind }}/$job"
dist="$root/dist"
mkdir -p "$root/work" "$root/mnt" "$dist/wheels"
exec >>"$root/bootstrap.log" 2>&1
echo "[veri] bootstrap for $job at $(date -u +%FT%TZ)"

# What the worker needs: the control plane's URL and this job's (replica's, Tinker model's)
# token, never an API key.
umask 077
cat >"$root/env" <<'VERI_ENV'
{% for name, value in env %}{{ name }}={{ value|shell }}
{% endfor %}VERI_ENV
set -a; . "$root/env"; set +a
worker_token="${{ token_name }}"
export VERI_TOKEN_FILE="$root/token"
umask 022

end_machine() {
{% if kind == "jobs" %}  # The machine's last act: ask the control plane to delete it (POST …/release, honoured once
  # the job has ended) with the job's current token, which the worker keeps in VERI_TOKEN_FILE
  # as it renews it. A powered-off machine still bills on most providers; a deleted one does not.
  local token
  token="$(cat "$VERI_TOKEN_FILE" 2>/dev/null || true)"
  curl -sS -o /dev/null -w "[veri] release answered %{http_code}\n" -m 30 --retry 4 \
    --retry-delay 5 -X POST -H "Authorization: Bearer ${token:-$worker_token}" \
    "$routes/release" || echo "[veri] release failed"
{% else %}  # A replica's (or a Tinker model's) machine is terminated by the control plane when it
  # ends the replica (the model), whose token dies then, so there is nothing to ask with.
{% endif %}  # If the control plane cannot delete it, the machine ends itself within
  # {{ self_stop_minutes }} minutes rather than renting on.
  ${VERI_SHUTDOWN:-shutdown} -h +{{ self_stop_minutes }}
}

# The machine could not be made ready. No customer code exists here yet, so the control plane
# believes this report (only before the worker registers, or while a replica or a Tinker model
# starts) and the job, replica or model ends as the platform's provisioning_error, refunded.
fail() {
  echo "[veri] bootstrap failed: $1"
{% if kind == "jobs" %}  curl -sS --max-time 30 -X POST -H "Authorization: Bearer $worker_token" \
    -H "Content-Type: application/json" "$routes/complete" \
    --data "{\"ok\": false, \"error_code\": \"provisioning_error\", \"message\": \"The machine's bootstrap failed: $1\"}" \
    || true
{% else %}  curl -sS --max-time 30 -X POST -H "Authorization: Bearer $worker_token" \
    -H "Content-Type: application/json" "$routes/failed" \
    --data "{\"code\": \"provisioning_error\", \"message\": \"The machine's bootstrap failed: $1\"}" \
    || true
{% endif %}
  end_machine
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
fetch() { curl -fsS --no-progress-meter --retry 5 --retry-delay 2 --retry-all-errors --connect-timeout 10 "$@"; }

# The sandbox the worker runs customer code in (worker/sandbox.py; without it, it runs none),
# and curl where the image has none (some container images).
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v curl >/dev/null || missing+=(curl ca-certificates)
if [ ${#missing[@]} -gt 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    || echo "[veri] could not install ${missing[*]}"
fi
command -v curl >/dev/null || { echo "[veri] no curl: cannot reach the control plane"; ${VERI_SHUTDOWN:-shutdown} -h now; exit 1; }

# What to install: the control plane picks the wheelhouse for the CUDA version the driver offers.
started=$(now)
cuda=$( (nvidia-smi 2>/dev/null || true) | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)
fetch -H "Authorization: Bearer $worker_token" -o "$dist/manifest" \
  "$routes/bootstrap?cuda=$cuda" || fail "it could not ask $api what to install"
python="" backend="" index="" package="" uv="" worker=""
: >"$dist/core.cfg"; : >"$dist/core.sums"; : >"$dist/wheels.cfg"; : >"$dist/wheels.sums"
while read -r kind a b c d; do
  case "$kind" in
    python) python="$a" ;;
    backend) backend="$a" ;;
    index) index="$a" ;;
    package) package="$a" ;;
    file)  # file KIND SHA256 NAME URL
      group=core path="$c"
      [ "$a" = wheel ] && group=wheels path="wheels/$c"
      [ "$a" = uv ] && uv="$dist/$path"
      [ "$a" = worker ] && worker="$dist/$path"
      printf 'url = "%s"\noutput = "%s"\n' "$d" "$dist/$path" >>"$dist/$group.cfg"
      printf '%s  %s\n' "$b" "$path" >>"$dist/$group.sums" ;;
  esac
done <"$dist/manifest"
[ -n "$uv" ] && [ -n "$worker" ] && [ -n "$python" ] || fail "the control plane's answer lacked the installer or the worker"
fetch --parallel --parallel-max 16 -K "$dist/core.cfg" || fail "the installer and the worker could not be downloaded"
(cd "$dist" && sha256sum --quiet -c core.sums) || fail "the installer or the worker arrived damaged"
chmod +x "$uv"
source=wheelhouse
if [ "$backend" = none ]; then
  echo "[veri] the control plane has no wheelhouse for this machine (CUDA ${cuda:-none})"
  source=index
elif ! fetch --parallel --parallel-max 16 -K "$dist/wheels.cfg" \
    || ! (cd "$dist" && sha256sum --quiet -c wheels.sums); then
  echo "[veri] the $backend wheelhouse could not be downloaded"
  source=index
fi
if [ "$source" = index ] && [ -z "$index" ]; then
  fail "no wheelhouse for this machine (CUDA ${cuda:-none}) could be downloaded, and no VERI_WORKER_INDEX_URL is set to install from instead"
fi
fetch_seconds=$(since "$started")

# A Python of the version the wheelhouse was built for: the image's own if it has that version,
# else one uv downloads (never the image's pip or python3-venv).
export UV_CACHE_DIR="$root/uv-cache" UV_PYTHON_INSTALL_DIR="$root/python" UV_NO_CONFIG=1
{% if python_mirror %}export UV_PYTHON_INSTALL_MIRROR={{ python_mirror|shell }}
{% endif %}started=$(now)
"$uv" venv --quiet --python "$python" "$root/venv" || fail "no Python $python could be found or downloaded"
python_seconds=$(since "$started")

# The worker and its pinned dependencies, in parallel, from the wheelhouse when it came (no
# index at all), else from the index with the torch build that matches the driver.
started=$(now)
install=("$uv" pip install --quiet --python "$root/venv/bin/python")
[ "$source" = wheelhouse ] && install+=(--find-links "$dist/wheels")
if [ "$source" = index ]; then
  install+=(--index-url "$index" --torch-backend auto)
elif [ -z "$package" ]; then
  install+=(--no-index)
else
  install+=(--index-url "${index:-https://pypi.org/simple}")
fi
"${install[@]}" "${package:-$worker}" || fail "the worker could not be installed from the ${source}"
install_seconds=$(since "$started")
export VERI_BOOTSTRAP="backend=$backend source=$source fetch_seconds=$fetch_seconds python_seconds=$python_seconds install_seconds=$install_seconds"
echo "[veri] installed: $VERI_BOOTSTRAP"
{% if engine_requirement %}
# The serving engine (settings.VERI_VLLM_REQUIREMENT: a replica's server, a Tinker model's
# sampler) in a virtualenv of its own: it pins its own torch, which uv takes built for the CUDA
# version the driver offers (--torch-backend auto). Its executables (`vllm`) go on the worker's
# PATH.
engine={{ engine_requirement|shell }}
started=$(now)
"$uv" venv --quiet --python "$python" "$root/engine" || fail "no Python $python could be found for $engine"
"$uv" pip install --quiet --python "$root/engine/bin/python" --torch-backend auto \
  --index-url "${index:-https://pypi.org/simple}" "$engine" || fail "$engine could not be installed"
export PATH="$root/engine/bin:$PATH"
echo "[veri] installed $engine in $(since "$started") s"
{% endif %}
export VERI_WORK_DIR="$root/work" VERI_MOUNT_ROOT="$root/mnt"
cd "$root/work"
status=0
"$root/venv/bin/python" -m worker{% for arg in worker_command %} {{ arg|shell }}{% endfor %} || status=$?
echo "[veri] worker exited with ${status}"
end_machine
