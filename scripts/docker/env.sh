# Shared settings of scripts/docker/*.sh (sourced, not run). Override any with the environment.
ARL_DOCKER_STATE="${ARL_DOCKER_STATE:-/run/arl-docker}"          # PID files, logs, sockets
ARL_DOCKER_DATA="${ARL_DOCKER_DATA:-/var/lib/arl-docker}"        # images and containers (kept across restarts)
ARL_DOCKER_SOCK="${ARL_DOCKER_SOCK:-$ARL_DOCKER_STATE/docker.sock}"
ARL_CONTAINERD_SOCK="$ARL_DOCKER_STATE/containerd/containerd.sock"
ARL_DOCKER_HOST="unix://$ARL_DOCKER_SOCK"
