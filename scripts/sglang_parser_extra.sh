#!/usr/bin/env bash
# Creates .venv-sglang-parser (idempotent): just enough of SGLang 0.5.23 to run its own argument
# parser (sglang.srt.server_args.prepare_server_args) on CPU, for validate_with_sglang_parser and
# tests/engines. The set below is what `from sglang.srt.server_args import prepare_server_args`
# needs at import time with the CPU wheel of torch 2.13.0 (found by iterating on ImportErrors;
# triton is imported unconditionally by sglang/srt/utils/common.py). About 2.3 GB.
# Use it with: export AUTORESEARCH_SGLANG_PYTHON=$PWD/.venv-sglang-parser/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SGLANG_PARSER_VENV:-.venv-sglang-parser}"
PY="${PYTHON:-python3.11}"
CHECK='from sglang.srt.server_args import prepare_server_args; from sglang.srt.speculative.spec_info import SpeculativeAlgorithm'
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "$VENV ready"; exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q torch==2.13.0
"$PIP" install -q --no-deps sglang==0.5.23
"$PIP" install -q numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec \
    pydantic pyzmq tqdm ipython aiohttp
"$VENV/bin/python" -c "$CHECK" && echo "$VENV ready"
