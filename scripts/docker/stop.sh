#!/usr/bin/env bash
# Stop the daemons scripts/docker/start.sh started, by their PID files: dockerd first, then containerd.
# SIGTERM, wait up to ARL_DOCKER_STOP_TIMEOUT (30 s) each, then SIGKILL. Images stay in $ARL_DOCKER_DATA.
set -uo pipefail
source "$(dirname "$0")/env.sh"
TIMEOUT="${ARL_DOCKER_STOP_TIMEOUT:-30}"

stop_pid() {  # name pidfile
  local name="$1" pidfile="$2" pid
  [ -f "$pidfile" ] || { echo "stop.sh: no $pidfile ($name not started by start.sh)" >&2; return 0; }
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 "$((TIMEOUT * 10))"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop.sh: $name ($pid) still running after ${TIMEOUT}s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
    echo "stop.sh: stopped $name ($pid)" >&2
  fi
  rm -f "$pidfile"
}

stop_pid dockerd "$ARL_DOCKER_STATE/dockerd.pid"
stop_pid containerd "$ARL_DOCKER_STATE/containerd.pid"
