"""Owns the emulator's model card: the architecture numbers the cost model prices a forward pass with.

A card is derived from a Hugging Face ``config.json`` (``emulator.hf_config``); the catalog's named
models are bundled config files loaded the same way. Parameter counts are the projections and
embeddings (norms, biases, routers and attention sinks are left out: under 0.1% of any supported model).
"""
from __future__ import annotations

from dataclasses import dataclass

MXFP4_BYTES = 4.25 / 8  # OCP MXFP4: 4-bit E2M1 elements plus one 8-bit E8M0 scale per block of 32


@dataclass(frozen=True)
class ModelCard:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # query/key head dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
    ffn: int  # dense MLP intermediate size (0 when every layer is MoE without a dense path)
    vocab: int
    experts: int = 0  # routed experts per MoE layer (0 = dense model)
    active_experts: int = 0  # top-k
    expert_ffn: int = 0  # intermediate size of one routed expert
    shared_ffn: int = 0  # always-on MLP path beside the routed experts (shared experts / dense MLP)
    moe_layers: int | None = None  # MoE layers (None = all layers when experts > 0)
    sliding_window: int = 0  # 0 = full attention everywhere
    full_layers: int = 0  # full-attention layers when sliding_window > 0 (the rest use the window)
    weight_bytes: float = 2.0  # bytes per parameter of the checkpoint (bf16 2, fp8 1)
    expert_weight_bytes: float | None = None  # routed experts' bytes per parameter when they differ (MXFP4)
    kv_dtype_bytes: float = 2.0  # KV cache element at kv_cache_dtype=auto (the model's 16-bit dtype)
    quantization: str | None = None  # the checkpoint's quantization_config.quant_method (fp8, mxfp4)
    context_len: int = 131072
    tied_embeddings: bool = False
    draft_fraction: float = 0.03  # EAGLE-style draft head cost relative to one target forward
    architecture: str = ""  # config.json architectures[0]
    # Multi-head latent attention (DeepSeek-V2/V3): all 0 for standard attention
    q_lora_rank: int = 0  # 0 = a full-rank q_proj
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Gated attention (Qwen3-Next / Qwen3.5 full-attention layers): q_proj also emits a sigmoid output gate
    attn_output_gate: bool = False
    # Linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5): no KV cache; a fixed recurrent state per
    # request (value heads x key dim x value dim, in ``linear_state_bytes`` each) and a short causal-conv state
    linear_layers: int = 0
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv_kernel: int = 0
    linear_state_bytes: float = 4.0  # SGLang's mamba_ssm_dtype default float32
    # DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer scores every prior token (index_heads of
    # index_head_dim, fp8) and the MLA attention itself reads only the top ``index_topk`` of them
    index_topk: int = 0
    index_heads: int = 0
    index_head_dim: int = 0
    index_layers: int | None = None  # layers that run their own indexer (GLM-5.2 shares one's top-k; None = all)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def n_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        return self.layers if self.moe_layers is None else self.moe_layers

    @property
    def n_index_layers(self) -> int:
        if not self.index_topk:
            return 0
        return self.layers if self.index_layers is None else self.index_layers

    @property
    def index_key_bytes(self) -> float:
        """DSA's indexer key of one token in one indexer layer: fp8 elements and one fp32 scale (SGLang's
        ``NSATokenToKVPool``)."""
        return self.index_head_dim + 4.0 if self.index_topk else 0.0

    TRAITS = ("linear_attention",)  # every trait ``traits`` can name

    @property
    def traits(self) -> frozenset[str]:
        """What makes model-specific knobs apply (``spec.Knob.model_trait``, a recipe's ``requires.model_trait``):
        ``linear_attention`` for hybrid models with recurrent-state layers."""
        return frozenset({"linear_attention"} if self.linear_layers else ())

    @property
    def attn_layers(self) -> int:
        """Layers with softmax attention (and a KV cache): all but the linear-attention layers."""
        return self.layers - self.linear_layers

    @property
    def attn_window(self) -> int:
        """Tokens a clipped attention layer reads at most: the sliding window, or DSA's top-k (0 = none)."""
        return self.sliding_window if self.sliding_window > 0 else self.index_topk

    @property
    def attn_params(self) -> int:
        """Attention projections summed over layers (softmax and linear-attention layers)."""
        return self.attn_layers * self.attn_params_per_layer + self.linear_layers * self.linear_params_per_layer

    @property
    def linear_params_per_layer(self) -> int:
        """Gated DeltaNet projections: q, k, v and the output gate z in, beta and the decay a per value head,
        and the output projection (the depthwise conv and norms are left out)."""
        if not self.linear_layers:
            return 0
        kd, vd = self.linear_k_heads * self.linear_k_dim, self.linear_v_heads * self.linear_v_dim
        return self.hidden * (2 * kd + 2 * vd + 2 * self.linear_v_heads) + vd * self.hidden

    def linear_state_bytes_per_request(self, tp: int = 1) -> float:
        """Recurrent + conv state of one request on one GPU, all linear-attention layers (heads split by TP)."""
        if not self.linear_layers:
            return 0.0
        ssm = self.linear_v_heads * self.linear_k_dim * self.linear_v_dim * self.linear_state_bytes
        conv_ch = 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim
        conv = conv_ch * max(0, self.linear_conv_kernel - 1) * self.kv_dtype_bytes
        return self.linear_layers * (ssm + conv) / tp

    @property
    def attn_params_per_layer(self) -> int:
        h, n = self.hidden, self.heads
        if self.is_mla:
            q = h * n * self.head_dim if not self.q_lora_rank else (
                h * self.q_lora_rank + self.q_lora_rank * n * self.head_dim)
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)  # latent + decoupled rope key
            qk_nope = self.head_dim - self.qk_rope_head_dim
            kv_b = self.kv_lora_rank * n * (qk_nope + self.v_head_dim)  # latent -> per-head K (nope) and V
            return q + kv_a + kv_b + n * self.v_head_dim * h
        q = h * n * self.head_dim * (2 if self.attn_output_gate else 1)
        kv = 2 * h * self.kv_heads * self.head_dim
        o = n * self.head_dim * h
        return q + kv + o

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up, down projections)."""
        return 3 * self.hidden * self.expert_ffn

    @property
    def dense_mlp_params(self) -> int:
        """Always-on MLP parameters summed over layers (dense layers' MLP + shared experts)."""
        dense_layers = self.layers - self.n_moe_layers
        return 3 * self.hidden * (self.ffn * dense_layers + self.shared_ffn * self.n_moe_layers)

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def routed_params(self) -> int:
        return self.n_moe_layers * self.experts * self.expert_params

    @property
    def total_params(self) -> int:
        return self.attn_params + self.dense_mlp_params + self.routed_params + self.embed_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches (top-k experts, plus the lm_head; embedding lookups are free)."""
        routed_active = self.n_moe_layers * self.active_experts * self.expert_params
        return (self.attn_params + self.dense_mlp_params + routed_active
                + self.vocab * self.hidden)

    @property
    def n_global_layers(self) -> int:
        """Softmax-attention layers that read the whole context (none under DSA: every layer reads its top-k)."""
        if self.index_topk > 0:
            return 0
        return self.attn_layers if self.sliding_window <= 0 else self.full_layers

    def param_bytes(self, fp8_weights: bool) -> float:
        """Bytes per non-expert parameter; fp8 quantization stores at most one byte."""
        return min(self.weight_bytes, 1.0) if fp8_weights else self.weight_bytes

    def expert_param_bytes(self, fp8_weights: bool) -> float:
        """Bytes per routed-expert parameter (an MXFP4 checkpoint keeps its experts in MXFP4 under fp8)."""
        b = self.weight_bytes if self.expert_weight_bytes is None else self.expert_weight_bytes
        return min(b, 1.0) if fp8_weights else b

    def weights_bytes(self, fp8_weights: bool) -> float:
        """Bytes of all weights (one replica, before TP splits them)."""
        dense, expert = self.param_bytes(fp8_weights), self.expert_param_bytes(fp8_weights)
        return self.total_params * dense + self.routed_params * (expert - dense)

    def kv_bytes_per_token(self, kv_bytes: float, tp: int = 1) -> float:
        """KV bytes one token occupies on one GPU, all layers. Standard attention stores K and V of each
        KV head (heads split by TP, replicated below one per GPU); MLA stores one latent vector of
        kv_lora_rank + qk_rope_head_dim per layer that every TP rank holds whole (SGLang's
        ``MLATokenToKVPool``; model_runner's cell size has no TP division on that branch)."""
        if self.is_mla:
            index = self.n_index_layers * self.index_key_bytes  # DSA: each indexer layer's key of the token
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * kv_bytes + index
        kv_heads_per_gpu = max(1.0, self.kv_heads / tp)
        return 2 * self.attn_layers * kv_heads_per_gpu * self.head_dim * kv_bytes
