#!/usr/bin/env bash
# `make test-container`: build the image and run the `container`-marked tests against it, on a machine as it
# comes. Where no Docker engine runs, it starts one (without a bridge or iptables, which such sandboxes lack;
# the tests use host networking) and stops it afterwards; where the default base image cannot be pulled,
# it builds a local one from Debian packages (scripts/container-base.sh, cached). Everything it starts, it
# stops. It prints how long each step took.
#
# Environment: PY (the venv's python, default .venv/bin/python), IMAGE (tag to build, default
# keda-gpu-scaler:test), BASE_IMAGE (skip the choice below and build on this one).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
IMAGE="${IMAGE:-keda-gpu-scaler:test}"
DEFAULT_BASE_IMAGE=python:3.11-slim
LOCAL_BASE_IMAGE=keda-gpu-scaler-base:bookworm
# Logs stay after the run (build/ is ignored by git and by the image's build context) for a failure's post-mortem.
LOGS=build/container
mkdir -p "$LOGS"

timings=()
dockerd_pid=""
dockerd_children=""

now() { date +%s.%N; }
record() { # record NAME START: the seconds since START, for the summary
  timings+=("$(awk -v name="$1" -v start="$2" -v end="$(now)" 'BEGIN { printf "%-22s %7.1f s", name, end - start }')")
}

# shellcheck disable=SC2317  # reached through the EXIT trap, which shellcheck does not follow
summary() {
  echo "--- make test-container: timings"
  local line
  for line in "${timings[@]}"; do echo "  $line"; done
}

# shellcheck disable=SC2317  # reached through the EXIT trap
cleanup() {
  local status=$?
  set +e
  # Ryuk, testcontainers' reaper, is off (it is an image to pull): remove what a crashed test run left.
  if [ -n "$dockerd_pid" ] || docker info >/dev/null 2>&1; then
    local leftovers
    leftovers="$(docker ps -aq --filter "ancestor=$IMAGE" --filter label=org.testcontainers.lang=python 2>/dev/null)"
    if [ -n "$leftovers" ]; then
      echo "removing containers the tests left: $leftovers"
      # shellcheck disable=SC2086  # one container id per word
      docker rm -f $leftovers >/dev/null
    fi
  fi
  if [ -n "$dockerd_pid" ]; then
    local start
    start="$(now)"
    kill -TERM "$dockerd_pid" 2>/dev/null
    # dockerd stops its containers and its own containerd first; give it the time that takes.
    for _ in $(seq 1 300); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$dockerd_pid" 2>/dev/null; then
      echo "dockerd ($dockerd_pid) did not stop within 30 s: killing it"
      kill -KILL "$dockerd_pid" 2>/dev/null
    fi
    wait "$dockerd_pid" 2>/dev/null
    # Its containerd, if it outlived it, by the ids seen while dockerd ran.
    for pid in $dockerd_children; do
      if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null; fi
    done
    record "dockerd stop" "$start"
  fi
  summary
  exit "$status"
}
trap cleanup EXIT

# 1. A Docker engine: the one that runs, or one started here.
if docker info >/dev/null 2>&1; then
  echo "using the running Docker engine"
else
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
      echo "no Docker engine runs and none can be installed here (needs root and apt-get): cannot run the container tests" >&2
      exit 1
    fi
    start="$(now)"
    echo "installing the Docker engine (Debian package docker.io)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
    record "install docker.io" "$start"
  fi
  start="$(now)"
  # No bridge and no iptables: this machine's kernel offers neither; containers use the host's network.
  dockerd --bridge=none --iptables=false --ip6tables=false --host=unix:///var/run/docker.sock \
    >"$LOGS/dockerd.log" 2>&1 &
  dockerd_pid=$!
  export DOCKER_HOST=unix:///var/run/docker.sock
  for _ in $(seq 1 600); do
    docker info >/dev/null 2>&1 && break
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
      dockerd_pid=""
      echo "dockerd exited at start; the end of $LOGS/dockerd.log:" >&2
      tail -n 20 "$LOGS/dockerd.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not answer within 60 s; the end of $LOGS/dockerd.log:" >&2
    tail -n 20 "$LOGS/dockerd.log" >&2
    exit 1
  fi
  dockerd_children="$(pgrep -P "$dockerd_pid" || true)"
  record "dockerd start" "$start"
  echo "started dockerd ($dockerd_pid); it is stopped at the end"
fi
# The tests' containers need no reaper container (which would have to be pulled): they remove their own.
export TESTCONTAINERS_RYUK_DISABLED=true

# 2. The base image: the official one when it is here or can be pulled, else a local Debian one.
base="${BASE_IMAGE:-}"
if [ -z "$base" ]; then
  start="$(now)"
  if docker image inspect "$DEFAULT_BASE_IMAGE" >/dev/null 2>&1 \
    || timeout 300 docker pull --quiet "$DEFAULT_BASE_IMAGE" >/dev/null 2>&1; then
    base="$DEFAULT_BASE_IMAGE"
    record "base image (pull)" "$start"
  else
    echo "$DEFAULT_BASE_IMAGE cannot be pulled here: using a local Debian base, $LOCAL_BASE_IMAGE"
    bash scripts/container-base.sh "$LOCAL_BASE_IMAGE"
    base="$LOCAL_BASE_IMAGE"
    record "base image (local)" "$start"
  fi
fi

# 3. The image. Host networking lets the build stage reach PyPI without a bridge; --force-rm leaves no
# container behind when a step fails.
start="$(now)"
echo "building $IMAGE on $base (log: $LOGS/image-build.log)"
if ! docker build --force-rm --network host --build-arg BASE_IMAGE="$base" -t "$IMAGE" . \
  >"$LOGS/image-build.log" 2>&1; then
  echo "docker build failed; the end of $LOGS/image-build.log:" >&2
  tail -n 40 "$LOGS/image-build.log" >&2
  exit 1
fi
record "image build" "$start"
# The image that held this tag before is now untagged: drop it (the build cache is kept).
docker image prune --force --filter label=org.opencontainers.image.title=keda-gpu-scaler >/dev/null
size="$(docker image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec-i --suffix=B)"
echo "built $IMAGE: $size"

# 4. The tests, against that image; here they must run, so a missing piece fails instead of skipping.
start="$(now)"
status=0
SCALER_TEST_IMAGE="$IMAGE" SCALER_CONTAINER_TESTS=required \
  "$PY" -m pytest -q -m container tests/container || status=$?
record "container tests" "$start"
timings+=("$(printf '%-22s %9s' "image size" "$size")")
exit "$status"
