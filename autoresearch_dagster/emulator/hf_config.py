"""Owns the derivation of a model card from a Hugging Face ``config.json`` (a fine-tune's own file or a
bundled catalog entry).

Field names are transformers' own (``models/<type>/configuration_<type>.py``); the family is chosen by
``model_type`` (else ``architectures[0]``). Omitted optional fields take transformers' defaults for that
family; a composite config (``text_config`` inside, e.g. Gemma 3/4 ``...ForConditionalGeneration``) is
saved by transformers as a diff against the text config's defaults, so its text config falls back to
those defaults for every field. Weight bytes come from ``quantization_config.quant_method``: none is
16-bit, ``fp8`` one byte, ``mxfp4`` 4.25 bits for the routed experts (gpt-oss keeps attention,
router, embeddings and lm_head in bf16). The KV cache at ``kv_cache_dtype=auto`` is the model's
16-bit dtype (SGLang serves float32 checkpoints in 16 bits too).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoresearch_dagster.emulator.card import MXFP4_BYTES, ModelCard
from autoresearch_dagster.spec import SpecError

# architectures[0] -> model_type, for configs that omit model_type
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral",
    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForCausalLM": "gemma4_text", "Gemma4ForConditionalGeneration": "gemma4", "GptOssForCausalLM": "gpt_oss",
    "DeepseekV3ForCausalLM": "deepseek_v3", "Glm4MoeForCausalLM": "glm4_moe",
    "DeepseekV32ForCausalLM": "deepseek_v32", "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5", "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5ForCausalLM": "qwen3_5_text", "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
}
_ARCH_OF = {mt: a for a, mt in ARCHITECTURES.items()}
# composite model_type -> its text config's model_type
COMPOSITE = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen3_5": "qwen3_5_text",
             "qwen3_5_moe": "qwen3_5_moe_text"}
SUPPORTED = tuple(sorted(set(ARCHITECTURES.values())))  # every family has its architectures[0] spelling above
# Hybrid families: Gated DeltaNet linear-attention layers between gated full-attention layers
HYBRID_LINEAR = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
MLA = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
DSA = ("deepseek_v32", "glm_moe_dsa")
SSM_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
# transformers' defaults of the fields read here, where a family's default is not hidden_size // heads
# (head_dim) or False (tie_word_embeddings); the Gemma text configs' full defaults serve composite files.
DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 128},
    "gemma2": {"head_dim": 256, "tie_word_embeddings": True},
    "gemma3_text": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "tie_word_embeddings": True, "sliding_window": 4096,
                    "sliding_window_pattern": 6},
    "gemma4_text": {"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "tie_word_embeddings": True, "sliding_window": 512,
                    "enable_moe_block": False, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0},
    "gpt_oss": {"head_dim": 64, "sliding_window": 128},
    "glm4_moe": {"head_dim": 128},
    # transformers' Qwen3NextConfig: every full_attention_interval-th layer is full attention, the rest Gated DeltaNet
    "qwen3_next": {"head_dim": 256, "full_attention_interval": 4, "attn_output_gate": True},
    "qwen3_5_text": {"full_attention_interval": 4, "attn_output_gate": True},
    "qwen3_5_moe_text": {"full_attention_interval": 4, "attn_output_gate": True},
}
REQUIRED = object()


def config_path(model: str | Path) -> Path:
    """The config.json a model path names: the file itself, or ``config.json`` inside a directory."""
    p = Path(model).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise SpecError(f"model directory {p.parent} has no config.json")
    elif not p.exists():
        raise SpecError(f"model config {p} does not exist")
    return p


def read_config(path: Path) -> dict[str, Any]:
    """A config.json's mapping; SpecError (one line naming the file) when unreadable or not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecError(f"model config {path} cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"model config {path} is not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"model config {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(data, dict):
        raise SpecError(f"model config {path} must be a JSON object, got {type(data).__name__}")
    return data


def load_card(model: str | Path, *, name: str | None = None) -> ModelCard:
    """The card of the model a config.json (or a directory holding one) describes."""
    path = config_path(model)
    return card_from_config(read_config(path), name=name or str(model), where=f"model config {path}")


class _Fields:
    """Typed reads of one config mapping, errors naming the file, the field and the model_type."""

    def __init__(self, data: dict[str, Any], defaults: dict[str, Any], where: str, model_type: str):
        self.data, self.defaults, self.where, self.model_type = data, defaults, where, model_type

    def get(self, key: str, default: Any = REQUIRED) -> Any:
        if self.data.get(key) is not None:
            return self.data[key]
        if key in self.defaults:
            return self.defaults[key]
        if default is REQUIRED:
            raise SpecError(f"{self.where}: missing field {key!r} (model_type {self.model_type})")
        return default

    def int(self, key: str, default: Any = REQUIRED, *, minimum: int = 1) -> int:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise SpecError(f"{self.where}: {key} must be an integer >= {minimum}, got {v!r}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise SpecError(f"{self.where}: {key} must be true or false, got {v!r}")
        return v

    def int_list(self, key: str) -> list[int]:
        v = self.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise SpecError(f"{self.where}: {key} must be a list of layer indices, got {v!r}")
        return v


def _model_type(cfg: dict[str, Any], where: str) -> tuple[str, str]:
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    mt = cfg.get("model_type") or ARCHITECTURES.get(arch)
    if not isinstance(mt, str) or not mt:
        raise SpecError(f"{where}: no model_type and no known architectures entry ({arch or 'none'}); "
                        f"supported model types: {', '.join(SUPPORTED)}")
    if mt not in SUPPORTED:
        raise SpecError(f"{where}: model_type {mt!r}{f' ({arch})' if arch else ''} is not supported; "
                        f"supported model types: {', '.join(SUPPORTED)}")
    return mt, arch


LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")


def _layer_types(f: _Fields, layers: int) -> list[str] | None:
    types = f.data.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != layers:
        raise SpecError(f"{f.where}: layer_types must list {layers} layer types (num_hidden_layers)")
    unknown = sorted({str(t) for t in types if t not in LAYER_TYPES})
    if unknown:
        raise SpecError(f"{f.where}: layer type {unknown[0]!r} is not supported ({', '.join(LAYER_TYPES)})")
    return types


def _linear_layers(f: _Fields, family: str, layers: int) -> list[bool]:
    """Which layers are linear attention (Gated DeltaNet): ``layer_types`` when given, else transformers' rule
    (every ``full_attention_interval``-th layer is full attention)."""
    if family not in HYBRID_LINEAR:
        return [False] * layers
    types = _layer_types(f, layers)
    if types is not None:
        return [t == "linear_attention" for t in types]
    interval = f.int("full_attention_interval")
    return [(i + 1) % interval != 0 for i in range(layers)]


def _sliding_layers(f: _Fields, family: str, layers: int) -> list[bool]:
    """Which layers attend within the sliding window: ``layer_types`` when given, else transformers'
    rule for the family."""
    if family in HYBRID_LINEAR:
        return [False] * layers
    types = _layer_types(f, layers)
    if types is not None:
        if "linear_attention" in types:
            raise SpecError(f"{f.where}: linear_attention layers are modelled for Qwen3-Next / Qwen3.5 only")
        return [t == "sliding_attention" for t in types]
    if family in ("gemma2", "gpt_oss"):  # alternating, starting with a sliding layer
        return [(i + 1) % 2 != 0 for i in range(layers)]
    if family in ("gemma3_text", "gemma4_text"):  # every sliding_window_pattern-th layer is global
        pattern = f.int("sliding_window_pattern", 6) if family == "gemma3_text" else 6
        return [(i + 1) % pattern != 0 for i in range(layers)]
    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not f.flag("use_sliding_window", False):
            return [False] * layers
        top = f.int("max_window_layers", 28, minimum=0)
        if family == "qwen2_moe":
            return [(i + 1) % 2 != 0 and i < top for i in range(layers)]
        if family == "qwen3_moe":
            return [True] * layers
        return [i >= top for i in range(layers)]
    if family == "mixtral":  # a window, when set, applies to every layer
        return [f.data.get("sliding_window") is not None] * layers
    return [False] * layers


def _moe(f: _Fields, family: str, layers: int) -> dict[str, Any]:
    """Routed experts, top-k, expert and always-on MLP sizes, and the number of MoE layers."""
    if family == "mixtral":
        return dict(ffn=0, experts=f.int("num_local_experts"), active_experts=f.int("num_experts_per_tok"),
                    expert_ffn=f.int("intermediate_size"))
    if family == "gpt_oss":
        return dict(ffn=0, experts=f.int("num_local_experts"), active_experts=f.int("num_experts_per_tok"),
                    expert_ffn=f.int("intermediate_size"))
    if family in ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe_text"):
        step, dense_only = f.int("decoder_sparse_step", 1), set(f.int_list("mlp_only_layers"))
        moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        shared = f.int("shared_expert_intermediate_size", minimum=0) if family != "qwen3_moe" else 0
        return dict(ffn=f.int("intermediate_size") if moe_layers < layers else 0, experts=f.int("num_experts"),
                    active_experts=f.int("num_experts_per_tok"), expert_ffn=f.int("moe_intermediate_size"),
                    shared_ffn=shared, moe_layers=moe_layers)
    if family in ("deepseek_v3", "deepseek_v32", "glm4_moe", "glm_moe_dsa"):  # first_k_dense_replace dense layers, then MoE every
        # moe_layer_freq-th layer (GLM-4.5/4.6: the DeepSeek-V3 MoE layout, no moe_layer_freq field)
        first, freq = f.int("first_k_dense_replace", minimum=0), f.int("moe_layer_freq", 1)
        moe_layers = sum(1 for i in range(layers) if i >= first and i % freq == 0)
        expert = f.int("moe_intermediate_size")
        return dict(ffn=f.int("intermediate_size") if moe_layers < layers else 0, experts=f.int("n_routed_experts"),
                    active_experts=f.int("num_experts_per_tok"), expert_ffn=expert,
                    shared_ffn=f.int("n_shared_experts", minimum=0) * expert, moe_layers=moe_layers)
    if family == "gemma4_text" and f.flag("enable_moe_block", False):  # experts beside a dense MLP in every layer
        return dict(ffn=0, experts=f.int("num_experts"), active_experts=f.int("top_k_experts"),
                    expert_ffn=f.int("moe_intermediate_size"), shared_ffn=f.int("intermediate_size"))
    return dict(ffn=f.int("intermediate_size"))


def _mla(f: _Fields) -> dict[str, Any]:
    rope, nope = f.int("qk_rope_head_dim"), f.int("qk_nope_head_dim")
    q_lora = f.get("q_lora_rank", None)  # null = a full-rank q_proj (DeepSeek-V2-Lite)
    if q_lora is not None and (isinstance(q_lora, bool) or not isinstance(q_lora, int) or q_lora < 1):
        raise SpecError(f"{f.where}: q_lora_rank must be an integer >= 1 or null, got {q_lora!r}")
    return dict(kv_lora_rank=f.int("kv_lora_rank"), q_lora_rank=q_lora or 0, qk_rope_head_dim=rope,
                v_head_dim=f.int("v_head_dim"), head_dim=nope + rope)


def _dsa(f: _Fields, layers: int) -> dict[str, Any]:
    """DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5.x): top-k tokens, index heads and head dim, and
    how many layers run their own indexer (GLM-5.2's ``indexer_types``: "shared" layers reuse an earlier top-k)."""
    types = f.data.get("indexer_types")
    if types is not None and (not isinstance(types, list) or len(types) != layers
                              or any(t not in ("full", "shared") for t in types)):
        raise SpecError(f"{f.where}: indexer_types must list {layers} entries of 'full' or 'shared'")
    return dict(index_topk=f.int("index_topk"), index_heads=f.int("index_n_heads"), index_head_dim=f.int("index_head_dim"),
                index_layers=None if types is None else types.count("full"))


def _linear(f: _Fields) -> dict[str, Any]:
    """Gated DeltaNet geometry (transformers' Qwen3NextConfig / Qwen3.5 text config field names)."""
    ssm = f.get("mamba_ssm_dtype", "float32")  # the recurrent state's dtype (SGLang's --mamba-ssm-dtype default)
    if ssm not in SSM_DTYPE_BYTES:
        raise SpecError(f"{f.where}: mamba_ssm_dtype must be one of {', '.join(SSM_DTYPE_BYTES)}, got {ssm!r}")
    return dict(linear_k_heads=f.int("linear_num_key_heads"), linear_v_heads=f.int("linear_num_value_heads"),
                linear_k_dim=f.int("linear_key_head_dim"), linear_v_dim=f.int("linear_value_head_dim"),
                linear_conv_kernel=f.int("linear_conv_kernel_dim"), linear_state_bytes=SSM_DTYPE_BYTES[ssm])


def _weights(cfg: dict[str, Any], where: str, is_moe: bool) -> dict[str, Any]:
    q = cfg.get("quantization_config")
    if q is None:
        return {}
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method == "fp8":
        return dict(weight_bytes=1.0, quantization="fp8")
    if method == "mxfp4":
        if not is_moe:
            raise SpecError(f"{where}: mxfp4 quantization is modelled for MoE experts only (gpt-oss)")
        return dict(expert_weight_bytes=MXFP4_BYTES, quantization="mxfp4")
    raise SpecError(f"{where}: quantization_config quant_method {method!r} is not supported (fp8, mxfp4)")


def card_from_config(cfg: dict[str, Any], *, name: str, where: str = "model config") -> ModelCard:
    """Derive a card from a config mapping; SpecError (one line) for an unsupported family or a bad field."""
    model_type, arch = _model_type(cfg, where)
    family, data = COMPOSITE.get(model_type, model_type), cfg
    if model_type in COMPOSITE:
        data = cfg.get("text_config")
        if not isinstance(data, dict):
            raise SpecError(f"{where}: missing field 'text_config' (model_type {model_type})")
    f = _Fields(data, DEFAULTS.get(family, {}), where, model_type)
    if family == "gemma4_text" and (f.int("hidden_size_per_layer_input", 0, minimum=0)
                                    or f.int("num_kv_shared_layers", 0, minimum=0)):
        raise SpecError(f"{where}: per-layer input embeddings and shared-KV layers (Gemma 4 E-series) are not modelled")
    layers, hidden, heads = f.int("num_hidden_layers"), f.int("hidden_size"), f.int("num_attention_heads")
    attn = _mla(f) if family in MLA else dict(head_dim=f.int("head_dim", hidden // heads))
    if family in DSA:
        attn.update(_dsa(f, layers))
    linear = _linear_layers(f, family, layers)
    if any(linear):
        attn.update(_linear(f), linear_layers=linear.count(True), attn_output_gate=f.flag("attn_output_gate", False))
    # Gemma 4 keeps its sliding layers' geometry for every layer: its global layers (global_head_dim,
    # num_global_key_value_heads) are not modelled separately.
    sliding = _sliding_layers(f, family, layers)
    window = f.int("sliding_window") if any(sliding) else 0
    moe = _moe(f, family, layers)
    if data.get("tie_word_embeddings") is None and cfg.get("tie_word_embeddings") is not None:
        data = {**data, "tie_word_embeddings": cfg["tie_word_embeddings"]}  # a composite's top-level setting
        f = _Fields(data, f.defaults, where, model_type)
    tied = f.flag("tie_word_embeddings", False)
    return ModelCard(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=f.int("num_key_value_heads", heads),
        vocab=f.int("vocab_size"), context_len=f.int("max_position_embeddings"), tied_embeddings=tied,
        sliding_window=window, full_layers=sliding.count(False), architecture=arch or _ARCH_OF.get(model_type, ""),
        **attn, **moe, **_weights(cfg, where, moe.get("experts", 0) > 0))
