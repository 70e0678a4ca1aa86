#!/usr/bin/env bash
# Start containerd + dockerd on sockets of our own and print the line that points docker at them:
#
#   eval "$(scripts/docker/start.sh)"     # exports DOCKER_HOST=unix:///run/arl-docker/docker.sock
#
# Also exports ARL_DOCKER_STARTED=1 when this call started the daemons (0 when one already answered: a
# caller that stops them afterwards, like .ci/run, then leaves them alone). Idempotent. PIDs go to
# $ARL_DOCKER_STATE/{containerd,dockerd}.pid (scripts/docker/stop.sh stops them by these), logs next to
# them. Flags: no iptables, no default bridge (containers get
# no network unless given one), cgroupfs driver. Waits up to ARL_DOCKER_START_TIMEOUT (60 s) for
# `docker info`; exits non-zero with the log's tail when the daemon does not come up.
set -euo pipefail
source "$(dirname "$0")/env.sh"
TIMEOUT="${ARL_DOCKER_START_TIMEOUT:-60}"

answers() { DOCKER_HOST="$ARL_DOCKER_HOST" timeout 10 docker info >/dev/null 2>&1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if answers; then
  echo "start.sh: dockerd already answers on $ARL_DOCKER_SOCK" >&2
  echo "export DOCKER_HOST=$ARL_DOCKER_HOST ARL_DOCKER_STARTED=0"
  exit 0
fi
for tool in containerd dockerd docker; do
  command -v "$tool" >/dev/null 2>&1 || { echo "start.sh: $tool not found: run scripts/docker/install.sh" >&2; exit 1; }
done
if [ "$(id -u)" -ne 0 ]; then echo "start.sh: dockerd needs root" >&2; exit 1; fi

mkdir -p "$ARL_DOCKER_STATE/containerd" "$ARL_DOCKER_DATA"
if ! alive "$ARL_DOCKER_STATE/containerd.pid"; then
  # setsid + nohup: the daemons outlive the shell that started them.
  setsid nohup containerd --address "$ARL_CONTAINERD_SOCK" \
    --root "$ARL_DOCKER_DATA/containerd" --state "$ARL_DOCKER_STATE/containerd/state" \
    >"$ARL_DOCKER_STATE/containerd.log" 2>&1 </dev/null &
  echo $! >"$ARL_DOCKER_STATE/containerd.pid"
  for _ in $(seq 1 "$((TIMEOUT * 10))"); do [ -S "$ARL_CONTAINERD_SOCK" ] && break; sleep 0.1; done
  if [ ! -S "$ARL_CONTAINERD_SOCK" ]; then
    echo "start.sh: containerd did not create $ARL_CONTAINERD_SOCK in ${TIMEOUT}s:" >&2
    tail -n 20 "$ARL_DOCKER_STATE/containerd.log" >&2
    exit 1
  fi
fi
if ! alive "$ARL_DOCKER_STATE/dockerd.pid"; then
  setsid nohup dockerd --containerd="$ARL_CONTAINERD_SOCK" --host="$ARL_DOCKER_HOST" \
    --data-root "$ARL_DOCKER_DATA/docker" --exec-root "$ARL_DOCKER_STATE/exec" \
    --pidfile "$ARL_DOCKER_STATE/dockerd.pid.daemon" \
    --iptables=false --bridge=none --exec-opt native.cgroupdriver=cgroupfs \
    >"$ARL_DOCKER_STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$ARL_DOCKER_STATE/dockerd.pid"
fi
deadline=$((SECONDS + TIMEOUT))
until answers; do
  if ! alive "$ARL_DOCKER_STATE/dockerd.pid" || [ $SECONDS -ge $deadline ]; then
    echo "start.sh: dockerd did not answer on $ARL_DOCKER_SOCK within ${TIMEOUT}s:" >&2
    tail -n 30 "$ARL_DOCKER_STATE/dockerd.log" >&2
    exit 1
  fi
  sleep 0.5
done
echo "start.sh: dockerd $(cat "$ARL_DOCKER_STATE/dockerd.pid") and containerd $(cat "$ARL_DOCKER_STATE/containerd.pid") answer on $ARL_DOCKER_SOCK" >&2
echo "export DOCKER_HOST=$ARL_DOCKER_HOST ARL_DOCKER_STARTED=1"
