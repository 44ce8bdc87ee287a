"""The CPU device spec (issue 14: the emulator as a prediction of vLLM on this machine's CPU): it loads by
name in any case, carries the measured figures' orders of magnitude, and prices a tiny Llama (written here
as its own config.json, shaped like .real-engine/tiny-llama) memory-bound at decode and slower than an H100."""
import json

import pytest

from autoresearch_dagster.emulator.catalog import gpu
from autoresearch_dagster.emulator.cost import CostModel
from autoresearch_dagster.emulator.hf_config import load_card
from autoresearch_dagster.emulator.resolve import resolve_config

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 32, "vocab_size": 3541, "max_position_embeddings": 16384, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16"}


def test_cpu_spec_loads_by_name():
    cpu = gpu("cpu-spr-2c")
    assert cpu is gpu("CPU-SPR-2C") and not cpu.has_fp8
    assert 1e11 < cpu.bf16_flops < 1e13 and 1e9 < cpu.hbm_bw < 1e11  # CPU scale, not GPU scale
    assert cpu.bf16_flops < gpu("H100").bf16_flops / 100


def test_tiny_llama_on_cpu_is_priced_slower_than_on_h100(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    card = load_card(str(tmp_path / "config.json"))
    cpu, h100 = gpu("cpu-spr-2c"), gpu("H100")
    res = resolve_config(card, cpu, 1, {})
    assert res.kv_bytes == 2.0
    t = {}
    for hw in (cpu, h100):
        cm = CostModel(card, hw, tp=1, fp8_weights=False, kv_bytes=2.0)
        t[hw.name] = cm.step(decode_reqs=8, decode_ctx=8 * 512, n_running=8).gpu_s
    assert t["CPU-SPR-2C"] > 10 * t["H100"]
    # a decode step of 8 requests reads the weights once: at least weights / bandwidth on the CPU
    assert t["CPU-SPR-2C"] >= card.param_bytes(False) / cpu.hbm_bw * 0.5
