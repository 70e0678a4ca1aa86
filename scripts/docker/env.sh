# Shared settings of scripts/docker/*.sh (sourced, not run). Override any with the environment.
ARL_DOCKER_STATE="${ARL_DOCKER_STATE:-/run/arl-docker}"          # PID files, logs, sockets
ARL_DOCKER_DATA="${ARL_DOCKER_DATA:-/var/lib/arl-docker}"        # images and containers (kept across restarts)
ARL_DOCKER_SOCK="${ARL_DOCKER_SOCK:-$ARL_DOCKER_STATE/docker.sock}"
ARL_CONTAINERD_SOCK="$ARL_DOCKER_STATE/containerd/containerd.sock"
ARL_DOCKER_HOST="unix://$ARL_DOCKER_SOCK"

# pip for downloading wheels/sdists on the host (the repo's Python 3.12, else python3, else uv's): fills PIP.
choose_pip() {
  if command -v python3.12 >/dev/null 2>&1 && python3.12 -m pip --version >/dev/null 2>&1; then
    PIP=(python3.12 -m pip)
  elif python3 -m pip --version >/dev/null 2>&1; then
    PIP=(python3 -m pip)
  else
    PIP=(uvx pip)
  fi
}
