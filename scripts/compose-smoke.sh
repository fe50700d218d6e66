#!/usr/bin/env bash
# End-to-end test of the image and the Compose stack on this machine's Docker
# engine: build, `up`, scale to 3 worker containers, run the cube job and the
# regression job through the driver container, `pipeline verify` both outputs,
# check that the load balancer's published port refuses clients without a
# certificate (and accepts one with it), check that nothing else is published
# beyond 127.0.0.1, then `down -v`. Prints the time from `up` to the first
# finished job.
#
#   bash scripts/compose-smoke.sh
#
# Environment:
#   COMPOSE                 compose command (default: docker-compose if installed,
#                           else `docker compose`)
#   COMPOSE_PROJECT_NAME    default pipeline-smoke (kept apart from a user's stack)
#   WORKERS_PER_CONTAINER   default 2 (so 3 containers = 6 single-threaded workers)
#   SMOKE_KEEP=1            leave the stack running on success (for poking around)
#   SMOKE_REQUIRE_REGRESSIONS=1  fail instead of skipping the regression job
#                           when examples/regressions.toml does not exist
# Host ports for the load balancer and the dashboard are free ones picked at
# start (LB_PORT, DASHBOARD_PORT to choose), so a running stack is not disturbed.
#
# On a machine without a container registry, start the workplace's Docker sandbox
# first (engine, docker-compose and local python:3.11-slim / haproxy:2.6).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[compose-smoke %4ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

if [[ -n "${COMPOSE:-}" ]]; then
  read -r -a compose_cmd <<<"$COMPOSE"
elif command -v docker-compose >/dev/null 2>&1; then
  compose_cmd=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
else
  die "neither docker-compose nor 'docker compose' is installed"
fi
docker info >/dev/null 2>&1 || die "no Docker engine (docker info failed)"

export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-pipeline-smoke}
export WORKERS_PER_CONTAINER=${WORKERS_PER_CONTAINER:-2}
export PUBLISH_ADDR=127.0.0.1
export PIPELINE_IMAGE=${PIPELINE_IMAGE:-pipeline:local}
# On a vfs storage driver creating a container copies the image's 800 MB, and
# docker-compose's 60 s default for one engine request was seen to run out
# ("Read timed out") under `compose run`, with the stack healthy.
export COMPOSE_HTTP_TIMEOUT=${COMPOSE_HTTP_TIMEOUT:-600}
export DOCKER_CLIENT_TIMEOUT=${DOCKER_CLIENT_TIMEOUT:-600}
# The stack's own dummy credentials and endpoint, whatever this shell holds.
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN PIPELINE_S3_ENDPOINT_URL
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export LB_PORT=${LB_PORT:-$(free_port)}
export DASHBOARD_PORT=${DASHBOARD_PORT:-$(free_port)}
[[ "$LB_PORT" != "$DASHBOARD_PORT" ]] || die "LB_PORT and DASHBOARD_PORT are both $LB_PORT"

scale=3
n_workers=$((scale * WORKERS_PER_CONTAINER))
bucket=${RESULTS_BUCKET:-results}
prefix="s3://$bucket/smoke-$(date -u +%Y%m%dT%H%M%S)"

compose() { "${compose_cmd[@]}" "$@"; }
# One-off commands in the driver container: no TTY, removed afterwards.
driver() { compose run --rm -T driver "$@"; }

# `down` can fail transiently on a slow engine (a network still has an endpoint of
# a `run --rm` container being removed): retry, then fail only if something of
# the project is really left, and say what.
teardown() {
  local attempt out
  for attempt in 1 2 3; do
    if out=$(compose down -v --remove-orphans --timeout 20 2>&1); then
      return 0
    fi
    log "down -v failed (attempt $attempt): $(tail -n 3 <<<"$out" | tr '\n' ' ')"
    sleep 5
  done
  local left
  left=$(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME"
    docker network ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME"
    docker volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")
  if [[ -n "$left" ]]; then
    log "FAILED: down -v left containers, networks or volumes of $COMPOSE_PROJECT_NAME: $(tr '\n' ' ' <<<"$left")"
    return 1
  fi
  log "down -v reported an error but nothing of $COMPOSE_PROJECT_NAME is left"
}

cleanup() {
  local status=$?
  trap - EXIT
  if ((status != 0)); then
    log "state of the stack at the failure:"
    compose ps >&2 || true
    compose logs --no-color --tail=60 >&2 || true
  fi
  if [[ "${SMOKE_KEEP:-}" == 1 && status -eq 0 ]]; then
    log "SMOKE_KEEP=1: stack $COMPOSE_PROJECT_NAME left running; '${compose_cmd[*]} -p $COMPOSE_PROJECT_NAME down -v' removes it"
  else
    log "tearing down (down -v)"
    teardown || status=1
  fi
  exit "$status"
}
trap cleanup EXIT

log "compose: ${compose_cmd[*]} (project $COMPOSE_PROJECT_NAME, lb 127.0.0.1:$LB_PORT, dashboard 127.0.0.1:$DASHBOARD_PORT)"
compose config -q || die "compose config rejected docker-compose.yml"
compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true

t0=$SECONDS
log "building the images (runtime and objectstore targets)"
compose build scheduler s3
t_build=$((SECONDS - t0))
docker image inspect "$PIPELINE_IMAGE" --format '{{.Size}}' >/dev/null || die "no image $PIPELINE_IMAGE after the build"
image_mb=$(($(docker image inspect "$PIPELINE_IMAGE" --format '{{.Size}}') / 1000000))
log "built in ${t_build}s; $PIPELINE_IMAGE is ${image_mb} MB"

t_up=$SECONDS
log "up -d"
compose up -d
log "scaling to $scale worker containers ($n_workers workers)"
compose up -d --scale "worker=$scale"

# Every `compose run` creates a container from the image (slow on a vfs
# storage driver), so helper steps share one; the two jobs run exactly as the
# README tells users to run them.
log "waiting until $n_workers workers are registered with the scheduler (through lb); make_bucket.py; input data"
driver sh -c "
python -c '
from pipeline.config import RunOptions, resolve
from pipeline.cluster.connect import connect
with connect(resolve(RunOptions, None, {})) as client:
    client.wait_for_workers($n_workers, timeout=180)
    workers = client.scheduler_info(n_workers=-1)[\"workers\"]
    print(len(workers), \"workers:\", \", \".join(sorted(workers)))
' &&
python /opt/pipeline/compose/make_bucket.py $bucket smoke-made-bucket &&
pipeline data frames --count 20 --rows 50 --cols 40 --out $prefix/frames &&
if [ -f examples/regressions.toml ]; then
  pipeline data regressions --chunks 40 --rows 200 --out $prefix/panel
fi
"
t_ready=$((SECONDS - t_up))

log "cube job: 64 cubes of 20^3 from 20 frames of 50x40"
driver pipeline run examples/cubes.toml --output "$prefix/cubes" --frames "$prefix/frames" \
  --cubes 64 --dim 20
t_first=$((SECONDS - t_up))
log "first job finished ${t_first}s after up"

# The regression job and the verify of both jobs in one container: one fewer to create.
steps="pipeline verify $prefix/cubes"
if [[ -f examples/regressions.toml ]]; then
  log "regression job: ols on 40 chunks of 200 rows, then pipeline verify of both jobs"
  steps="pipeline run examples/regressions.toml --output $prefix/regressions \
    --data $prefix/panel && $steps && pipeline verify $prefix/regressions"
  ran_regressions=yes
elif [[ "${SMOKE_REQUIRE_REGRESSIONS:-}" == 1 ]]; then
  die "examples/regressions.toml does not exist"
else
  ran_regressions=no
  log "WARNING: examples/regressions.toml does not exist: regression job SKIPPED; pipeline verify"
fi
driver sh -c "$steps"

log "the load balancer's port refuses clients without a certificate"
# From the host's network namespace (where 127.0.0.1:$LB_PORT is published),
# in the image so the host needs no Python packages; certificates from the
# stack's volume. The client with its certificate must get through, so that a
# refusal is known to come from TLS and not from an unreachable port.
docker run --rm --network host -e LB_PORT \
  -v "${COMPOSE_PROJECT_NAME}_certs:/etc/pipeline/tls:ro" \
  "$PIPELINE_IMAGE" python -c '
import os, socket, ssl, sys
from distributed import Client
from distributed.security import Security

port, tls = int(os.environ["LB_PORT"]), "/etc/pipeline/tls"
failed = []

def dask_client(label, address, security, expect_ok):
    try:
        with Client(address, security=security, timeout=15) as c:
            workers = c.scheduler_info(n_workers=-1)["workers"]
        outcome, ok = f"connected, {len(workers)} workers", True
    except Exception as exc:
        outcome, ok = f"refused: {type(exc).__name__}: {str(exc)[:150]}", False
    print(f"  {label}: {outcome}")
    if ok != expect_ok:
        failed.append(label)

dask_client("dask client, TLS with client certificate", f"tls://127.0.0.1:{port}",
    Security(tls_ca_file=f"{tls}/ca.pem", tls_client_cert=f"{tls}/client.pem",
             tls_client_key=f"{tls}/client-key.pem", require_encryption=True), True)
dask_client("dask client, plain tcp://", f"tcp://127.0.0.1:{port}", None, False)
# A certificate the cluster CA did not sign: refused by the scheduler.
from pipeline.cluster.tls import make_certificates
other = make_certificates("/tmp/other-ca")
dask_client("dask client, TLS with a certificate of another CA", f"tls://127.0.0.1:{port}",
    Security(tls_ca_file=f"{tls}/ca.pem", tls_client_cert=str(other["client"]),
             tls_client_key=str(other["client-key"]), require_encryption=True), False)

# The same at the TLS level: handshake without a certificate, then read.
ctx = ssl.create_default_context(cafile=f"{tls}/ca.pem")
ctx.check_hostname = False
try:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
         ctx.wrap_socket(raw) as s:
        s.sendall(b"\0" * 8)
        data = s.recv(1)
    outcome, ok = f"open ({data!r})", bool(data)
except (ssl.SSLError, OSError) as exc:
    outcome, ok = f"refused: {type(exc).__name__}: {exc}", False
print(f"  raw TLS handshake without certificate: {outcome}")
if ok:
    failed.append("raw TLS")
sys.exit(f"unexpected outcome: {failed}" if failed else 0)
'

log "the dashboard answers on 127.0.0.1:$DASHBOARD_PORT"
python3 -c "
import sys, urllib.request
base = 'http://127.0.0.1:$DASHBOARD_PORT'
health = urllib.request.urlopen(base + '/health', timeout=10).read()
status = urllib.request.urlopen(base + '/status', timeout=30).status
print(f'  /health: {health!r}, /status: HTTP {status}')
sys.exit(0 if health == b'ok' and status == 200 else 1)
" || die "dashboard not reachable on 127.0.0.1:$DASHBOARD_PORT"

log "only the load balancer and the dashboard are published, on 127.0.0.1"
published=$(docker ps --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" \
  --format '{{.Label "com.docker.compose.service"}} {{.Ports}}')
printf '  %s\n' "$published" >&2
while read -r service ports; do
  for mapping in ${ports//,/ }; do
    [[ "$mapping" == *"->"* ]] || continue
    case "$service:$mapping" in
      "lb:127.0.0.1:$LB_PORT->8786/tcp" | "scheduler:127.0.0.1:$DASHBOARD_PORT->8787/tcp") ;;
      *) die "unexpected published port: $service $mapping" ;;
    esac
  done
done <<<"$published"
grep -q "^lb .*127.0.0.1:$LB_PORT->8786/tcp" <<<"$published" || die "lb is not published on 127.0.0.1:$LB_PORT"

t_total=$((SECONDS - t0))
log "PASSED: build ${t_build}s, up to $n_workers workers ready and input data written ${t_ready}s, up to first finished job ${t_first}s, total ${t_total}s; image ${image_mb} MB; regressions: $ran_regressions"
