#!/usr/bin/env bash
# Build the base image the SWE tasks' Dockerfiles start FROM, from Debian's packages and PyPI wheels only:
#
#   scripts/docker/build_base_image.sh [--force] [--tag arl-swe-base:bookworm]
#
# mmdebstrap (bookworm, minbase, this machine's apt sources) + python3 (3.11), python3-venv, python3-pip,
# git, patch, tmux, procps, ca-certificates, ...; pytest and its dependencies are installed inside from
# a wheelhouse downloaded here from PyPI first (no network inside the image build), then the tarball is
# `docker import`ed with PATH/LANG/CMD set. Skips when the tag exists (unless --force). Needs root, a
# running dockerd (DOCKER_HOST, see scripts/docker/start.sh) and mmdebstrap (scripts/docker/install.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/docker/env.sh
export DOCKER_HOST="${DOCKER_HOST:-$ARL_DOCKER_HOST}"

TAG="arl-swe-base:bookworm"
FORCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --tag) TAG="$2"; shift ;;
    *) echo "usage: $0 [--force] [--tag NAME:TAG]" >&2; exit 2 ;;
  esac
  shift
done
PYTEST_SPEC="${ARL_BASE_PYTEST_SPEC:-pytest==9.2.0}"  # = arl.harbor.swe.venvs.PYTEST_REQUIREMENT
# gettext: packages whose tests compile translations (humanize) skip those tests without it.
PACKAGES="python3,python3-venv,python3-pip,git,patch,tmux,procps,ca-certificates,less,file,xz-utils,curl,gettext"

if [ "$FORCE" -eq 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "build_base_image.sh: $TAG exists (--force rebuilds)" >&2
  exit 0
fi
command -v mmdebstrap >/dev/null 2>&1 || { echo "build_base_image.sh: no mmdebstrap: run scripts/docker/install.sh" >&2; exit 1; }
timeout 10 docker info >/dev/null 2>&1 || { echo "build_base_image.sh: dockerd does not answer on $DOCKER_HOST: run scripts/docker/start.sh" >&2; exit 1; }

work="$(mktemp -d /tmp/arl-base-image.XXXXXX)"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
# Wheels for the image's Python (3.11, pure Python: pytest and its deps have py3-none-any wheels).
choose_pip
PIP_CACHE_DIR="$work/pip-cache" timeout 600 "${PIP[@]}" download --quiet --only-binary :all: \
  --python-version 3.11 --implementation py --abi none --platform any \
  -d "$work/wheelhouse" "$PYTEST_SPEC"
echo "build_base_image.sh: wheelhouse: $(ls "$work/wheelhouse" | tr '\n' ' ')" >&2

# The hooks run after the packages are installed: copy the wheelhouse in, pip install offline (a clean
# environment: none of this host's pip settings), clean up.
timeout 1200 mmdebstrap --quiet --variant=minbase --mode=root --include="$PACKAGES" \
  --customize-hook="copy-in $work/wheelhouse /tmp" \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin python3 -m pip install --quiet --no-index --no-cache-dir --break-system-packages --find-links /tmp/wheelhouse '"'$PYTEST_SPEC'" \
  --customize-hook='chroot "$1" python3 -m pytest --version' \
  --customize-hook='rm -rf "$1"/tmp/wheelhouse "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  bookworm "$work/base.tar"
t1=$SECONDS
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.arl.base.pytest=$PYTEST_SPEC org.arl.base.packages=$PACKAGES" \
  --change 'CMD ["bash"]' \
  "$work/base.tar" "$TAG" >/dev/null
docker run --rm --network none "$TAG" sh -c 'python3 --version && python3 -m pytest --version && git --version' >&2
echo "build_base_image.sh: $TAG built (mmdebstrap + wheels $((t1 - t0)) s, import $((SECONDS - t1)) s; $(du -h "$work/base.tar" | cut -f1) tar)" >&2
