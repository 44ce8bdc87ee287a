"""Model cards derived from Hugging Face config.json files the tests write themselves: each family's
parameters, KV bytes per token and active parameters against numbers worked out here from the config
(and the models' published sizes), MLA's latent KV reaching the KV pool and its read cost, quantization
setting weight bytes, the bundled catalog keeping its numbers, and one-line errors for bad files."""
import json

import numpy as np
import pytest

from autoresearch_dagster.emulator.catalog import MODELS_DIR, GiB, MODELS, gpu, model_card
from autoresearch_dagster.emulator.core import EmuRequest, EngineCore
from autoresearch_dagster.emulator.cost import CostModel, Efficiency
from autoresearch_dagster.emulator.hf_config import load_card
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.resolve import resolve_config
from autoresearch_dagster.emulator.sim import simulate
from autoresearch_dagster.spec import SpecError, load_endpoint

# --------------------------------------------------------------------------------- the configs

LLAMA_FT = {  # a Llama-3.2-1B-shaped fine-tune (tied embeddings, head_dim 64)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
QWEN3_MOE = {  # Qwen/Qwen3-30B-A3B
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
    "use_sliding_window": False, "sliding_window": None}
QWEN2_MOE = {  # a small Qwen2-MoE with a shared expert, MoE every 2nd layer and layer 1 forced dense
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 1024,
    "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 352, "shared_expert_intermediate_size": 1408,
    "decoder_sparse_step": 2, "mlp_only_layers": [1, 3], "vocab_size": 151936, "max_position_embeddings": 8192}
MIXTRAL = {  # mistralai/Mixtral-8x7B-v0.1
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": None,
    "tie_word_embeddings": False}
GEMMA2 = {  # google/gemma-2-9b (tie_word_embeddings omitted: Gemma's default is tied)
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256}
GEMMA3 = {  # google/gemma-3-27b-it: a composite config whose text_config is a diff against Gemma3TextConfig
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}}
GPT_OSS = {  # openai/gpt-oss-120b
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 128, "num_experts_per_tok": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
    "sliding_window": 128, "tie_word_embeddings": False,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}}
GLM45_AIR = {  # zai-org/GLM-4.5-Air: DeepSeek-V3's MoE layout (1 dense layer, 1 shared expert) with GQA attention
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
    "head_dim": 128, "n_shared_experts": 1, "n_routed_experts": 128, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "partial_rotary_factor": 0.5, "attention_bias": True, "vocab_size": 151552,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "num_nextn_predict_layers": 1}

QWEN3_NEXT = {  # Qwen/Qwen3-Next-80B-A3B-Instruct's shape: 3 Gated DeltaNet layers per gated full-attention layer
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
    "intermediate_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "vocab_size": 151936,
    "max_position_embeddings": 262144, "tie_word_embeddings": False}
DEEPSEEK_V32 = {**DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}  # DeepSeek-V3.2's indexer


def write(tmp_path, name, cfg) -> str:
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d / "config.json")


def gqa_attn(h, heads, kv, hd):
    return h * heads * hd + 2 * h * kv * hd + heads * hd * h  # q, k+v, o


def mlp(h, ffn):
    return 3 * h * ffn  # gate, up, down


# ----------------------------------------------------------------------- each family's numbers

def test_llama_fine_tune(tmp_path):
    c = load_card(write(tmp_path, "ft", LLAMA_FT))
    attn, ffn = gqa_attn(2048, 32, 8, 64), mlp(2048, 8192)
    total = 16 * (attn + ffn) + 128256 * 2048  # tied: one embedding matrix
    assert c.total_params == total and abs(total / 1.24e9 - 1) < 0.01  # Llama-3.2-1B: 1.24B
    assert c.active_params == total  # dense, and the tied lm_head is the embedding: every weight is read
    assert c.kv_bytes_per_token(2.0) == 2 * 16 * 8 * 64 * 2  # K and V, 16 layers, 8 heads x 64, bf16
    assert c.kv_bytes_per_token(2.0, tp=4) == 2 * 16 * 2 * 64 * 2  # 2 KV heads per GPU
    assert c.kv_bytes_per_token(2.0, tp=16) == 2 * 16 * 1 * 64 * 2  # replicated below one head per GPU
    assert c.architecture == "LlamaForCausalLM" and c.context_len == 131072 and c.sliding_window == 0


def test_qwen3_moe(tmp_path):
    c = load_card(write(tmp_path, "q", QWEN3_MOE))
    attn, expert = gqa_attn(2048, 32, 4, 128), mlp(2048, 768)
    total = 48 * (attn + 128 * expert) + 2 * 151936 * 2048
    active = 48 * (attn + 8 * expert) + 151936 * 2048  # top-8 experts + lm_head
    assert c.total_params == total and abs(total / 30.5e9 - 1) < 0.01  # Qwen3-30B-A3B: 30.5B total
    assert c.active_params == active and abs((active + 151936 * 2048) / 3.3e9 - 1) < 0.02  # 3.3B with embeddings
    assert c.kv_bytes_per_token(2.0) == 2 * 48 * 4 * 128 * 2
    assert c.ffn == 0 and c.n_moe_layers == 48  # intermediate_size unused: no dense layer


def test_qwen2_moe_shared_expert_sparse_step_and_dense_layers(tmp_path):
    c = load_card(write(tmp_path, "q2", QWEN2_MOE))
    # MoE where (i+1) % 2 == 0 and i not in mlp_only_layers: layers 5 and 7 (1 and 3 are forced dense)
    moe_layers, dense_layers = 2, 6
    attn = gqa_attn(1024, 16, 16, 64)
    total = (8 * attn + dense_layers * mlp(1024, 2816) + moe_layers * (mlp(1024, 1408) + 60 * mlp(1024, 352))
             + 2 * 151936 * 1024)
    active = (8 * attn + dense_layers * mlp(1024, 2816) + moe_layers * (mlp(1024, 1408) + 4 * mlp(1024, 352))
              + 151936 * 1024)
    assert c.n_moe_layers == moe_layers and c.total_params == total and c.active_params == active
    assert c.kv_bytes_per_token(2.0) == 2 * 8 * 16 * 64 * 2  # head_dim = hidden / heads


def test_mixtral(tmp_path):
    c = load_card(write(tmp_path, "m", MIXTRAL))
    attn, expert = gqa_attn(4096, 32, 8, 128), mlp(4096, 14336)
    total, active = 32 * (attn + 8 * expert) + 2 * 32000 * 4096, 32 * (attn + 2 * expert) + 32000 * 4096
    assert c.total_params == total and abs(total / 46.7e9 - 1) < 0.01  # Mixtral 8x7B: 46.7B
    assert c.active_params == active and abs((active + 32000 * 4096) / 12.9e9 - 1) < 0.01  # 12.9B per token
    assert c.kv_bytes_per_token(2.0) == 2 * 32 * 8 * 128 * 2 and c.sliding_window == 0


def test_gemma2_alternating_sliding_layers_and_tied_default(tmp_path):
    c = load_card(write(tmp_path, "g2", GEMMA2))
    total = 42 * (gqa_attn(3584, 16, 8, 256) + mlp(3584, 14336)) + 256000 * 3584
    assert c.tied_embeddings and c.total_params == total and abs(total / 9.24e9 - 1) < 0.01  # gemma-2-9b: 9.24B
    assert c.head_dim == 256 != 3584 // 16  # head_dim from the config, not hidden / heads
    assert c.sliding_window == 4096 and c.n_global_layers == 21  # layers 1, 3, 5, ... are global
    assert c.kv_bytes_per_token(2.0) == 2 * 42 * 8 * 256 * 2


def test_gemma3_composite_config_takes_text_defaults(tmp_path):
    c = load_card(write(tmp_path, "g3", GEMMA3))
    vocab = 262208  # Gemma3TextConfig's default (the file omits it, as the Hub's does)
    total = 62 * (gqa_attn(5376, 32, 16, 128) + mlp(5376, 21504)) + vocab * 5376
    assert c.vocab == vocab and c.tied_embeddings and c.total_params == total
    assert abs(total / 27.0e9 - 1) < 0.02  # Gemma 3 27B (text part; the vision tower adds ~0.4B)
    assert c.sliding_window == 1024 and c.n_global_layers == 62 // 6  # every 6th layer global: 5, 11, ..., 59
    assert c.context_len == 131072 and c.architecture == "Gemma3ForConditionalGeneration"


def test_gpt_oss_mxfp4_experts_and_alternating_windows(tmp_path):
    c = load_card(write(tmp_path, "oss", GPT_OSS))
    attn, expert = gqa_attn(2880, 64, 8, 64), mlp(2880, 2880)
    routed = 36 * 128 * expert
    total = 36 * attn + routed + 2 * 201088 * 2880
    active = 36 * (attn + 4 * expert) + 201088 * 2880
    assert c.total_params == total and abs(total / 116.8e9 - 1) < 0.01  # gpt-oss-120b: 116.8B
    assert c.active_params == active and abs(active / 5.1e9 - 1) < 0.02  # 5.1B active
    assert c.sliding_window == 128 and c.n_global_layers == 18
    assert c.kv_bytes_per_token(2.0) == 2 * 36 * 8 * 64 * 2 and c.kv_dtype_bytes == 2.0
    # MXFP4: 4-bit elements + an 8-bit scale per 32 = 4.25 bits for the experts, bf16 for the rest
    weights = (total - routed) * 2 + routed * 4.25 / 8
    assert c.weights_bytes(False) == pytest.approx(weights)
    assert 60e9 < weights < 80e9  # gpt-oss-120b fits on one 80 GB GPU
    res = resolve_config(c, gpu("H100"), 1, {})
    assert res.weight_gib == pytest.approx(weights / GiB) and res.kv_bytes == 2.0
    assert c.expert_param_bytes(True) == 4.25 / 8  # quantization=fp8 leaves MXFP4 experts alone


MLA_KV = 61 * (512 + 64)  # elements per token: one latent (kv_lora_rank) + rope key (qk_rope_head_dim) per layer


def test_deepseek_v3_mla_params_and_latent_kv(tmp_path):
    c = load_card(write(tmp_path, "ds", DEEPSEEK_V3))
    h, n = 7168, 128
    attn = (h * 1536 + 1536 * n * (128 + 64)  # q_a_proj, q_b_proj
            + h * (512 + 64)  # kv_a_proj_with_mqa
            + 512 * n * (128 + 128)  # kv_b_proj: latent -> K (nope) and V per head
            + n * 128 * h)  # o_proj
    dense, moe = 3, 58  # first_k_dense_replace
    shared, expert = mlp(h, 2048), mlp(h, 2048)
    total = 61 * attn + dense * mlp(h, 18432) + moe * (shared + 256 * expert) + 2 * 129280 * h
    active = 61 * attn + dense * mlp(h, 18432) + moe * (shared + 8 * expert) + 129280 * h
    assert c.is_mla and c.total_params == total and abs(total / 671e9 - 1) < 0.01  # 671B (685B with the MTP layer)
    assert c.active_params == active and abs(active / 37e9 - 1) < 0.03  # 37B activated
    # the latent cache: 61 x 576 x 2 bytes, the same on every TP rank (not 2 x kv_heads x head_dim)
    assert c.kv_bytes_per_token(2.0) == MLA_KV * 2 == 70272
    assert c.kv_bytes_per_token(2.0, tp=8) == MLA_KV * 2
    assert c.kv_bytes_per_token(1.0, tp=8) == MLA_KV  # fp8 KV halves it
    assert c.quantization == "fp8" and c.weights_bytes(False) == total * 1.0  # an fp8 checkpoint: 1 byte
    assert c.weights_bytes(True) == total * 1.0  # quantization=fp8 cannot halve it again


def test_glm4_moe_dense_first_layer_shared_expert_and_wide_gqa_heads(tmp_path):
    c = load_card(write(tmp_path, "glm", GLM45_AIR))
    h = 4096
    attn = gqa_attn(h, 96, 8, 128)  # 96 x 128 query width, three times the hidden size
    expert = mlp(h, 1408)
    total = 46 * attn + mlp(h, 10944) + 45 * (expert + 128 * expert) + 2 * 151552 * h
    active = 46 * attn + mlp(h, 10944) + 45 * (expert + 8 * expert) + 151552 * h
    assert c.total_params == total and abs(total / 106e9 - 1) < 0.01  # GLM-4.5-Air: 106B total
    assert c.active_params == active and abs(active / 12e9 - 1) < 0.07  # 12B active
    assert c.n_moe_layers == 45 and c.shared_ffn == 1408 and c.ffn == 10944 and not c.is_mla
    assert c.kv_bytes_per_token(2.0) == 2 * 46 * 8 * 128 * 2
    assert c.architecture == "Glm4MoeForCausalLM"
    no_head_dim = load_card(write(tmp_path, "glm2", {k: v for k, v in GLM45_AIR.items() if k != "head_dim"}))
    assert no_head_dim.head_dim == 128  # transformers' Glm4MoeConfig default, not hidden // heads (42)
    big = model_card("glm-4.6")  # bundled: 355B total, 32B active (the MTP layer left out)
    assert abs(big.total_params / 355e9 - 1) < 0.01 and abs(big.active_params / 32e9 - 1) < 0.03
    assert big.n_moe_layers == 89


def test_qwen3_next_linear_layers_hold_a_fixed_state_instead_of_kv(tmp_path):
    c = load_card(write(tmp_path, "next", QWEN3_NEXT))
    h = 2048
    full = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h  # q_proj doubled by the output gate
    kd, vd = 16 * 128, 32 * 128
    linear = h * (2 * kd + 2 * vd + 2 * 32) + vd * h  # q, k, v, z; beta and a per value head; out_proj
    experts = mlp(h, 512)
    total = 12 * full + 36 * linear + 48 * (experts + 512 * experts) + 2 * 151936 * h
    active = 12 * full + 36 * linear + 48 * (experts + 10 * experts) + 151936 * h
    assert (c.linear_layers, c.attn_layers, c.n_global_layers) == (36, 12, 12)
    assert c.total_params == total and abs(total / 80e9 - 1) < 0.01  # Qwen3-Next-80B-A3B: 80B total
    assert c.active_params == active and active < 4e9  # "A3B"
    assert c.kv_bytes_per_token(2.0) == 2 * 12 * 2 * 256 * 2  # only the 12 full-attention layers keep KV
    state = 36 * (32 * 128 * 128 * 4 + (2 * kd + vd) * 3 * 2)  # fp32 recurrent state + bf16 conv state (kernel 4)
    assert c.linear_state_bytes_per_request() == state and c.linear_state_bytes_per_request(tp=4) == state / 4
    explicit = {**QWEN3_NEXT, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12}
    del explicit["full_attention_interval"]
    assert load_card(write(tmp_path, "next2", explicit), name=c.name) == c  # layer_types and the interval agree
    # the state pool takes 0.9 / 1.9 of the cache memory and bounds the running requests
    hw = gpu("H100")
    r = EngineCore(c, hw, 4, {"tp_size": 4}, seed=0).resolved
    pool = hw.memory_gib * GiB * r.knobs["mem_fraction_static"] - c.weights_bytes(False) / 4
    assert r.max_total_num_tokens == pytest.approx(pool / 1.9 / c.kv_bytes_per_token(2.0, 4), rel=1e-3)
    assert r.knobs["max_running_requests"] == int(pool * 0.9 / 1.9 // (state / 4))
    # the knob mamba_full_memory_ratio moves memory between states and KV: more requests in flight, fewer tokens
    more = EngineCore(c, hw, 4, {"tp_size": 4, "mamba_full_memory_ratio": 3.0}, seed=0).resolved
    assert more.knobs["max_running_requests"] == int(pool * 3.0 / 4.0 // (state / 4)) > r.knobs["max_running_requests"]
    assert more.max_total_num_tokens == pytest.approx(pool / 4.0 / c.kv_bytes_per_token(2.0, 4), rel=1e-3)
    dense = EngineCore(model_card("qwen3-8b"), hw, 1, {}, seed=0).resolved
    assert EngineCore(model_card("qwen3-8b"), hw, 1, {"mamba_full_memory_ratio": 3.0}, seed=0).resolved \
        .max_total_num_tokens == dense.max_total_num_tokens  # no effect on a model without linear layers
    # SGLang's default mamba scheduler strategy (no_buffer) with the radix cache turns the overlap scheduler off
    assert r.knobs["disable_overlap_schedule"] and not r.knobs["disable_radix_cache"]
    no_radix = EngineCore(c, hw, 4, {"tp_size": 4, "disable_radix_cache": True}, seed=0).resolved
    assert not no_radix.knobs["disable_overlap_schedule"]
    assert not EngineCore(model_card("qwen3-8b"), hw, 1, {}, seed=0).resolved.knobs["disable_overlap_schedule"]
    from autoresearch_dagster.emulator.engine_view import vllm_gpu_defaults
    assert vllm_gpu_defaults(c, hw, tp=4)["disable_radix_cache"]  # vLLM: no prefix caching for hybrids by default
    assert "disable_radix_cache" not in vllm_gpu_defaults(model_card("qwen3-8b"), hw)
    # each decode step reads and writes every request's state once per linear layer
    eff = Efficiency()
    cm = CostModel(c, hw, tp=4, fp8_weights=False, kv_bytes=2.0, eff=eff)
    kv_bw = hw.hbm_bw * eff.kv_mbu * hw.mbu_scale
    small, big = (cm.step(decode_reqs=n, decode_ctx=n * 1000, decode_ctx_swa=n * 1000, n_running=n) for n in (8, 64))
    kv_only = (c.kv_bytes_per_token(2.0, 4) * 56 * 1001 + 56 * c.layers * eff.decode_req_layer_s * kv_bw) / kv_bw
    assert big.attn_s - small.attn_s == pytest.approx(kv_only + 2 * 56 * state / 4 / kv_bw, rel=0.02)


def test_deepseek_v32_attention_reads_its_top_k_and_the_indexer_reads_everything(tmp_path):
    c, v3 = load_card(write(tmp_path, "v32", DEEPSEEK_V32)), load_card(write(tmp_path, "v3", DEEPSEEK_V3))
    assert (c.index_topk, c.index_heads, c.index_head_dim, c.attn_window, c.n_global_layers) == (2048, 64, 128, 2048, 0)
    assert c.total_params == v3.total_params and c.is_mla  # the indexer's projections (~1%) are left out
    assert c.kv_bytes_per_token(2.0) == 61 * (576 * 2 + 128 + 4)  # latent + fp8 index key and its scale
    hw, eff = gpu("H200"), Efficiency()
    cm = CostModel(c, hw, tp=8, fp8_weights=True, kv_bytes=2.0, eff=eff)
    cm3 = CostModel(v3, hw, tp=8, fp8_weights=True, kv_bytes=2.0, eff=eff)
    ctx = 16 * 65536  # 16 requests at 64k tokens
    top = 16 * 2048
    s32 = cm.step(decode_reqs=16, decode_ctx=ctx, decode_ctx_swa=top, n_running=16)
    s3 = cm3.step(decode_reqs=16, decode_ctx=ctx, decode_ctx_swa=ctx, n_running=16)
    kv_bw = hw.hbm_bw * eff.kv_mbu * hw.mbu_scale
    latent = 61 * 576 * 2 * (top + 16) / kv_bw + 16 * 61 * eff.decode_req_layer_s
    index = max(61 * 2 * 64 * 128 * ctx / (hw.fp8_flops * eff.attn_mfu), 61 * 132 * (ctx + 16) / kv_bw)
    assert s32.attn_s == pytest.approx(latent + index, rel=0.01)
    assert s32.attn_s < s3.attn_s / 3  # at 64k tokens the sparse attention reads a fraction of the latent cache
    # through the engine: long-context decode on V3.2 beats V3 on the same GPUs
    reqs = lambda: [EmuRequest(f"r{i}", 30000, 200, [], 64, 0.0) for i in range(8)]  # noqa: E731
    tpot = {}
    for name, card in (("v32", c), ("v3", v3)):
        res = simulate(EngineCore(card, hw, 8, {"tp_size": 8}, seed=0, noise=NoiseSettings.off()), reqs(),
                       sample_interval_s=3600.0, start_s=0.0)
        tpot[name] = np.median([(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in res.requests])
    assert tpot["v32"] < 0.9 * tpot["v3"]
    # GLM-5.2 (bundled): MLA + DSA where only the "full" indexer_types layers run an indexer (21 of 78)
    glm = model_card("glm-5.2")
    assert (glm.n_index_layers, glm.index_heads, glm.head_dim, glm.v_head_dim) == (21, 32, 256, 256)
    assert abs(glm.total_params / 744e9 - 1) < 0.01 and abs(glm.active_params / 40e9 - 1) < 0.03  # 744B / 40B active
    assert glm.kv_bytes_per_token(2.0) == 78 * 576 * 2 + 21 * 132
    shared_all = load_card(write(tmp_path, "glm", {**json.loads(
        (MODELS_DIR / "glm-5.2" / "config.json").read_text()), "indexer_types": ["full"] * 78}))
    assert shared_all.n_index_layers == 78
    with pytest.raises(SpecError, match="indexer_types must list 78"):
        load_card(write(tmp_path, "glm2", {**json.loads((MODELS_DIR / "glm-5.2" / "config.json").read_text()),
                                           "indexer_types": ["full"]}))


def test_bundled_qwen35_cards_match_the_published_parameter_counts():
    nine = model_card("qwen3.5-9b")  # text layers of Qwen3.5-9B: 24 Gated DeltaNet + 8 gated attention layers
    assert (nine.linear_layers, nine.attn_layers, nine.ffn, nine.kv_heads) == (24, 8, 12288, 4)
    # the checkpoint's counted tensors: 6,919,561,728 in the language layers (norms and convs included, which the card
    # leaves out), 1,017,118,720 per embedding matrix
    assert abs((nine.attn_params + nine.dense_mlp_params) / 6_919_561_728 - 1) < 0.001
    assert nine.vocab * nine.hidden == 1_017_118_720
    moe = model_card("qwen3.5-35b-a3b")  # 35B total, 3B active
    assert abs(moe.total_params / 35e9 - 1) < 0.02 and abs(moe.active_params / 3e9 - 1) < 0.05
    assert moe.kv_bytes_per_token(2.0) == 2 * 10 * 2 * 256 * 2  # 10 full-attention layers of 40


def test_mla_kv_size_reaches_kv_capacity_and_read_cost(tmp_path):
    c = load_card(write(tmp_path, "ds", DEEPSEEK_V3))
    hw = gpu("H200")
    caps = {}
    for kv_dtype, kv_bytes in (("auto", 2.0), ("fp8_e4m3", 1.0)):
        core = EngineCore(c, hw, 8, {"tp_size": 8, "kv_cache_dtype": kv_dtype}, seed=0)
        r = core.resolved
        assert r.fp8_weights and r.kv_bytes == kv_bytes  # the fp8 checkpoint runs fp8 GEMMs without the knob
        pool = hw.memory_gib * GiB * r.knobs["mem_fraction_static"] - c.total_params * 1.0 / 8
        per_token = MLA_KV * kv_bytes
        assert 0 <= pool - r.max_total_num_tokens * per_token < per_token * max(1, r.knobs["page_size"])
        info = core.server_info()["internal_states"][0]["memory_usage"]
        assert info["kvcache"] == pytest.approx(r.max_total_num_tokens * per_token / GiB, abs=0.01)
        caps[kv_dtype] = r.max_total_num_tokens
        # decode of 32 requests at 8k context on a memory-bound attention: KV bytes read / KV bandwidth,
        # plus the attention kernels' per-sequence work (cost.py: decode_req_layer_s per request and layer)
        eff = Efficiency()
        cm = CostModel(c, hw, tp=8, fp8_weights=True, kv_bytes=kv_bytes, eff=eff)
        ctx = 32 * 8192
        step = cm.step(decode_reqs=32, decode_ctx=ctx, decode_ctx_swa=ctx, n_running=32)
        read = per_token * (ctx + 32)  # context read + the new tokens' KV written
        per_seq = 32 * c.layers * eff.decode_req_layer_s
        assert step.attn_s == pytest.approx(read / (hw.hbm_bw * eff.kv_mbu * hw.mbu_scale) + per_seq, rel=0.01)
    assert caps["fp8_e4m3"] / caps["auto"] == pytest.approx(2.0, rel=1e-3)


# ----------------------------------------------------------------------------- the catalog

def test_catalog_entries_are_bundled_configs_with_todays_numbers():
    # the totals / actives the catalog's hand-written cards had before they became config files
    expected = {"llama-3.1-8b": (8_029_995_008, 7_504_658_432, 32), "qwen2.5-32b": (32_762_757_120, 31_984_189_440, 64),
                "gemma-moe-26b-a4b": (25_149_538_304, 3_738_927_104, 5),
                "qwen3-235b-a22b": (235_043_553_280, 21_518_352_384, 94)}
    assert set(expected) <= set(MODELS)  # others may be bundled beside them
    for name, (total, active, n_global) in expected.items():
        c = model_card(name)
        assert (c.total_params, c.active_params, c.n_global_layers) == (total, active, n_global), name
    assert model_card("gemma-moe-26b-a4b").kv_bytes_per_token(2.0) == 2 * 30 * 8 * 256 * 2
    assert model_card("llama-3.1-8b").architecture == "LlamaForCausalLM"


def test_speculative_defaults_follow_the_architecture(tmp_path):
    spec = {"speculative_algorithm": "EAGLE"}
    llama = resolve_config(load_card(write(tmp_path, "l", LLAMA_FT)), gpu("H100"), 1, spec).knobs
    qwen = resolve_config(load_card(write(tmp_path, "q", QWEN3_MOE)), gpu("H100"), 1, spec).knobs
    assert (llama["speculative_num_steps"], llama["speculative_eagle_topk"]) == (5, 4)  # SGLang's Llama default
    assert (qwen["speculative_num_steps"], qwen["speculative_eagle_topk"]) == (3, 1)


# ---------------------------------------------------------------------------- spec and errors

def test_endpoint_spec_points_at_a_config_relative_to_its_file(tmp_path):
    path = write(tmp_path / "models", "ft", LLAMA_FT)
    spec_dir = tmp_path / "endpoints"
    spec_dir.mkdir()
    for model in ("../models/ft/config.json", "../models/ft"):  # the file, or the directory holding it
        (spec_dir / "ep.yaml").write_text(f"name: ep\nmodel: {model}\nhardware: {{gpu: H100}}\nsla: 'ttft_p99<=1s'\n")
        ep = load_endpoint(spec_dir / "ep.yaml")
        assert ep.model == str((tmp_path / "models" / "ft" / ("config.json" if model.endswith("json") else "")).resolve()).rstrip("/")
        assert model_card(ep.model).total_params == load_card(path).total_params
    # a catalog name and a hub id for SGLang stay as written
    (spec_dir / "ep.yaml").write_text("name: ep\nmodel: llama-3.1-8b\nhardware: {gpu: H100}\nsla: 'ttft_p99<=1s'\n")
    assert load_endpoint(spec_dir / "ep.yaml").model == "llama-3.1-8b"
    (spec_dir / "ep.yaml").write_text("name: ep\nmodel: ./local-dir\nengine: sglang\nhardware: {gpu: H100}\n"
                                      "sla: 'ttft_p99<=1s'\n")
    assert load_endpoint(spec_dir / "ep.yaml").model == "./local-dir"


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
    ("[1, 2]", "must be a JSON object"),
    ({**LLAMA_FT, "model_type": "mamba", "architectures": ["MambaForCausalLM"]},
     "model_type 'mamba' (MambaForCausalLM) is not supported; supported model types: deepseek_v3, deepseek_v32, gemma2"),
    ({k: v for k, v in LLAMA_FT.items() if k != "hidden_size"}, "missing field 'hidden_size' (model_type llama)"),
    ({**LLAMA_FT, "num_hidden_layers": "16"}, "num_hidden_layers must be an integer >= 1, got '16'"),
    ({k: v for k, v in DEEPSEEK_V3.items() if k != "kv_lora_rank"}, "missing field 'kv_lora_rank' (model_type deepseek_v3)"),
    ({**LLAMA_FT, "quantization_config": {"quant_method": "awq"}}, "quant_method 'awq' is not supported (fp8, mxfp4)"),
    ({**LLAMA_FT, "layer_types": ["full_attention"] * 15}, "layer_types must list 16 layer types"),
    ({**LLAMA_FT, "layer_types": ["linear_attention"] * 16}, "linear_attention layers are modelled for Qwen3-Next"),
    ({**QWEN3_NEXT, "layer_types": ["mamba"] * 48}, "layer type 'mamba' is not supported"),
    ({k: v for k, v in QWEN3_NEXT.items() if k != "linear_num_value_heads"},
     "missing field 'linear_num_value_heads' (model_type qwen3_next)"),
    ({**QWEN3_NEXT, "mamba_ssm_dtype": "int8"}, "mamba_ssm_dtype must be one of float32, bfloat16, float16"),
    ({k: v for k, v in DEEPSEEK_V32.items() if k != "index_topk"}, "missing field 'index_topk' (model_type deepseek_v32)"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(SpecError) as e:
        model_card(str(path))
    assert message in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def test_unknown_names_and_empty_directories_say_what_is_accepted(tmp_path):
    with pytest.raises(SpecError, match="known models: .*llama-3.1-8b.*or a path to a Hugging Face config.json"):
        model_card("llama-9b")
    with pytest.raises(SpecError, match="has no config.json"):
        model_card(str(tmp_path) + "/")


def test_a_hybrid_model_reuses_a_previous_turn_but_not_a_shared_system_prompt():
    """SGLang's MambaRadixCache: a recurrent state is saved where a cached prompt ends, so the next turn of a
    conversation resumes from it, while prompts that only share a system prompt branch where no state exists."""
    system = list(range(1, 17))  # 16 blocks of 64 tokens shared by every request

    def run(card, requests):
        core = EngineCore(card, gpu("H100"), 1, {}, seed=0, noise=NoiseSettings.off())
        res = simulate(core, requests, sample_interval_s=3600.0, start_s=0.0)
        return {r.rid: r.cached_tokens for r in res.requests}

    branching = [EmuRequest(f"b{i}", 20 * 64, 8, system + [1000 * i + j for j in range(4)], 64, 2.0 * i)
                 for i in range(1, 5)]
    turn1 = system + [900 + j for j in range(4)]
    turns = [EmuRequest("t1", 20 * 64, 8, turn1, 64, 0.0),
             EmuRequest("t2", 28 * 64, 8, turn1 + [950 + j for j in range(8)], 64, 2.0)]
    dense, hybrid = model_card("qwen3-8b"), model_card("qwen3.5-9b")
    assert [run(dense, branching)[f"b{i}"] for i in range(2, 5)] == [16 * 64] * 3  # the system prompt is reused
    assert [run(hybrid, branching)[f"b{i}"] for i in range(2, 5)] == [0] * 3  # no state where they branch
    assert run(dense, turns)["t2"] == run(hybrid, turns)["t2"] == 20 * 64  # the previous turn, whole
