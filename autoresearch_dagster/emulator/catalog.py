"""Owns the emulator's catalog: model cards (public architecture numbers) and GPU specs.

Numbers come from the models' published ``config.json`` files and the vendors' datasheets (cited
beside each entry). FLOP/s figures are *dense* (no 2:4 sparsity); memory is the capacity the
driver reports (GiB), which is what SGLang's memory-based defaults key on.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoresearch_dagster.spec import SpecError

GiB = 1024 ** 3


@dataclass(frozen=True)
class ModelCard:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP intermediate size (0 when every layer is MoE without a dense path)
    vocab: int
    experts: int = 0  # routed experts per MoE layer (0 = dense model)
    active_experts: int = 0  # top-k
    expert_ffn: int = 0  # intermediate size of one routed expert
    shared_ffn: int = 0  # always-on MLP path beside the routed experts (shared experts / dense MLP)
    moe_layers: int | None = None  # MoE layers (None = all layers when experts > 0)
    sliding_window: int = 0  # 0 = full attention everywhere
    global_every: int = 1  # every n-th layer is full attention when sliding_window > 0
    weight_bytes: float = 2.0  # bf16 checkpoint
    context_len: int = 131072
    tied_embeddings: bool = False
    draft_fraction: float = 0.03  # EAGLE-style draft head cost relative to one target forward

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def n_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        return self.layers if self.moe_layers is None else self.moe_layers

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
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
        return self.layers * self.attn_params_per_layer + self.dense_mlp_params + self.routed_params + self.embed_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches (top-k experts, plus the lm_head; embedding lookups are free)."""
        routed_active = self.n_moe_layers * self.active_experts * self.expert_params
        return (self.layers * self.attn_params_per_layer + self.dense_mlp_params + routed_active
                + self.vocab * self.hidden)

    @property
    def n_global_layers(self) -> int:
        if self.sliding_window <= 0:
            return self.layers
        return max(1, self.layers // self.global_every)

    def kv_bytes_per_token(self, kv_bytes: float, tp: int = 1) -> float:
        """KV bytes one token occupies on one GPU (K and V, all layers; KV heads split by TP, replicated below 1)."""
        kv_heads_per_gpu = max(1.0, self.kv_heads / tp)
        return 2 * self.layers * kv_heads_per_gpu * self.head_dim * kv_bytes


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bf16_flops: float  # dense tensor-core FLOP/s
    fp8_flops: float  # dense; equals bf16 where the GPU has no fp8 tensor cores
    hbm_bw: float  # bytes/s
    memory_gib: float  # as reported by the driver
    link_bw: float  # per-GPU interconnect bandwidth one way, bytes/s (NVLink or PCIe)
    link_latency_s: float  # latency of one small all-reduce
    has_fp8: bool = True

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GiB


MODELS: dict[str, ModelCard] = {m.name: m for m in [
    # meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
    # intermediate 14336, vocab 128256 (8.03B parameters).
    ModelCard("llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
              vocab=128256, context_len=131072),
    # Qwen/Qwen2.5-32B-Instruct config.json: 64 layers, hidden 5120, 40 heads, 8 KV heads,
    # intermediate 27648, vocab 152064 (32.5B parameters).
    ModelCard("qwen2.5-32b", layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128, ffn=27648,
              vocab=152064, context_len=32768),
    # Gemma 4 26B-A4B (google/gemma-4-26b-a4b-it config.json; NeMo Megatron-Bridge gemma4_provider:
    # 128 experts, top-8, plus a dense MLP path; sliding layers head_dim 256 / 8 KV heads, 1 global
    # layer in 6): 30 layers, hidden 2816, 16 heads, expert intermediate 704, dense intermediate 2112,
    # vocab 262144, tied embeddings. About 25B total / 3.8B active parameters. The card uses the
    # sliding-layer head geometry for every layer (global layers' wider heads with fewer KV heads
    # store about the same bytes per token).
    ModelCard("gemma-moe-26b-a4b", layers=30, hidden=2816, heads=16, kv_heads=8, head_dim=256, ffn=0,
              vocab=262144, experts=128, active_experts=8, expert_ffn=704, shared_ffn=2112,
              sliding_window=1024, global_every=6, tied_embeddings=True, context_len=262144),
    # Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 heads, 4 KV heads, head_dim 128,
    # 128 experts, top-8, moe_intermediate 1536, vocab 151936 (235B total / 22B active).
    ModelCard("qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, ffn=0,
              vocab=151936, experts=128, active_experts=8, expert_ffn=1536, context_len=40960),
]}

GPUS: dict[str, GPUSpec] = {g.name: g for g in [
    # NVIDIA H100 SXM5 datasheet: 989 TFLOPS bf16 dense, 1979 fp8 dense, 3.35 TB/s HBM3, 80 GB,
    # NVLink 4 900 GB/s (bidirectional; 450 GB/s each way).
    GPUSpec("H100", bf16_flops=989e12, fp8_flops=1979e12, hbm_bw=3.35e12, memory_gib=79.6,
            link_bw=450e9, link_latency_s=8e-6),
    # NVIDIA H200 SXM datasheet: H100 compute, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s.
    GPUSpec("H200", bf16_flops=989e12, fp8_flops=1979e12, hbm_bw=4.8e12, memory_gib=139.8,
            link_bw=450e9, link_latency_s=8e-6),
    # NVIDIA HGX B200 datasheet (per GPU): 2.25 PFLOPS bf16 dense, 4.5 PFLOPS fp8 dense, 8 TB/s HBM3e,
    # 180 GB, NVLink 5 1.8 TB/s (900 GB/s each way).
    GPUSpec("B200", bf16_flops=2250e12, fp8_flops=4500e12, hbm_bw=8.0e12, memory_gib=178.4,
            link_bw=900e9, link_latency_s=6e-6),
    # NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS bf16 dense, no fp8 tensor cores (fp8 weights run as
    # weight-only w8a16: bytes halve, FLOP/s do not), 2.04 TB/s HBM2e, NVLink 3 600 GB/s.
    GPUSpec("A100", bf16_flops=312e12, fp8_flops=312e12, hbm_bw=2.039e12, memory_gib=79.2,
            link_bw=300e9, link_latency_s=10e-6, has_fp8=False),
    # NVIDIA L40S datasheet: 362 TFLOPS bf16 dense (733 sparse), 733 TFLOPS fp8 dense, 864 GB/s
    # GDDR6, 48 GB, no NVLink: PCIe Gen4 x16 64 GB/s (32 GB/s each way).
    GPUSpec("L40S", bf16_flops=362e12, fp8_flops=733e12, hbm_bw=0.864e12, memory_gib=44.5,
            link_bw=32e9, link_latency_s=25e-6),
]}


def model_card(name: str) -> ModelCard:
    try:
        return MODELS[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r} for the emulator; known models: {', '.join(sorted(MODELS))}") from None


def gpu(name: str) -> GPUSpec:
    try:
        return GPUS[name.upper()]
    except KeyError:
        raise SpecError(f"unknown GPU {name!r} for the emulator; known GPUs: {', '.join(sorted(GPUS))}") from None
