#!/usr/bin/env bash
# Creates .venv-sglang (idempotent): SGLang 0.5.23's CLI parser and its benchmark client
# (`python -m sglang.bench_serving`) on a CPU-only machine, kept apart from .venv because it is
# ~6 GB (a CUDA build of torch used on the CPU). Used only by benchmarks/bench_runner.py.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SGLANG_VENV:-.venv-sglang}"
PY="${PYTHON:-python3.11}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import sglang.bench_serving" 2>/dev/null; then
    echo "$VENV ready"; exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
# torch 2.14.1 + torchvision 0.29.1 lie on this machine's disk (pip's find-links / constraints).
"$PIP" install -q torch==2.14.1 torchvision==0.29.1
"$PIP" install -q --no-deps sglang==0.5.23
"$PIP" install -q transformers datasets aiohttp msgspec numpy orjson psutil pybase64 requests \
    packaging pillow starlette pydantic pyzmq tqdm ipython apache-tvm-ffi sentencepiece \
    compressed-tensors gguf triton tokenizers
"$VENV/bin/python" -c "import sglang.bench_serving" && echo "$VENV ready"
