#!/usr/bin/env bash
# mini-swe-agent for sandboxes without network: download its wheelhouse from PyPI (here, once), then
# install it offline into an image (the Dockerfile lines printed at the end) or a host venv for the
# local sandbox (--venv).
#
#   scripts/docker/agent_wheelhouse.sh [--out DIR] [--venv DIR]
#
# DIR defaults to .cache/agents/mini-swe-agent/wheels: 72 wheels (~84 MB) pinned for the image's
# Python (Debian bookworm's 3.11, x86_64) + requirements.txt. The install is slim: mini-swe-agent
# --no-deps without `datasets` and `textual` (unused by its `mini` command), ~400 MB with bytecode.
# See arl.harbor.agents.install (the same steps in Python) and arl.harbor.agents.mini_swe.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=".cache/agents/mini-swe-agent/wheels"
VENV=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift ;;
    --venv) VENV="$2"; shift ;;
    *) echo "usage: $0 [--out DIR] [--venv DIR]" >&2; exit 2 ;;
  esac
  shift
done
export UV_PYTHON_DOWNLOADS=never
if [ ! -f "$OUT/requirements.txt" ]; then
  uv run --quiet python -m arl.harbor.agents.install wheelhouse "$OUT"
fi
if [ -n "$VENV" ]; then
  uv run --quiet python -m arl.harbor.agents.install venv --wheelhouse "$OUT" --venv "$VENV" >&2
fi
echo "# Dockerfile lines (copy $OUT into the build context as agent-wheels/):" >&2
uv run --quiet python -m arl.harbor.agents.install dockerfile-lines --context-dir agent-wheels
