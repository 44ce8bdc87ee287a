#!/usr/bin/env bash
# Runs the test suite: starts a throwaway PostgreSQL cluster for the Postgres storage test,
# runs pytest, and always stops the cluster (by its own pid, never by name).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
if [ -x scripts/pg.sh ]; then
  eval "$(bash scripts/pg.sh start)" || { echo "could not start PostgreSQL" >&2; exit 1; }
  trap 'bash scripts/pg.sh stop "$AUTORESEARCH_PG_DIR"' EXIT
fi
# Headless Chromium for the UI test (installed from Debian's packages when missing); the test must run.
if [ -z "${AUTORESEARCH_CHROMIUM:-}" ]; then
  AUTORESEARCH_CHROMIUM=$(bash scripts/browser.sh) || { echo "could not install chromium" >&2; exit 1; }
  export AUTORESEARCH_CHROMIUM
fi
export AUTORESEARCH_REQUIRE_BROWSER=1
# SGLang's own argument parser, when `make sglang-parser` has built its venv (optional, ~2.3 GB).
if [ -z "${AUTORESEARCH_SGLANG_PYTHON:-}" ] && [ -x .venv-sglang-parser/bin/python ]; then
  export AUTORESEARCH_SGLANG_PYTHON=$PWD/.venv-sglang-parser/bin/python
fi
"$PY" -m pytest "$@"
