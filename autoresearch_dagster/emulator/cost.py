"""Owns the emulator's cost model: iteration time from FLOPs and bytes (a per-kernel-class roofline),
KV-cache capacity, and the SGLang-like resolution of memory-dependent defaults.

Each forward pass is split into the kernel classes a profile shows — dense GEMMs (QKV/O
projections, dense MLP, lm_head), MoE expert GEMMs, attention, TP all-reduce, sampling — and each
class costs ``max(FLOPs / (peak x MFU), bytes / (HBM bandwidth x MBU))``: the roofline, with
documented efficiency factors (``Efficiency``). Per step there is CPU overhead (scheduling, batch
preparation, output processing) and, when a decode batch is larger than the largest captured CUDA
graph, kernel-launch overhead for every layer (eager mode). fp8 weights halve weight bytes and use
fp8 tensor-core peak; an fp8 KV cache halves KV bytes read and doubles the tokens that fit.

The MoE weight traffic grows with the batch: T tokens each picking k of E experts touch an
expected fraction ``1 - (1 - k/E)^T`` of the experts, so decode of a small batch reads few expert
weights and a large batch reads nearly all of them (why MoE decode is costlier per step than its
"active parameters" suggest).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from autoresearch_dagster.emulator.catalog import GiB, GPUSpec, ModelCard
from autoresearch_dagster.spec import SpecError


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak, and CPU costs. Defaults and their sources:

    - ``gemm_mfu`` 0.70: large bf16 GEMMs on Hopper reach 65-75% of dense peak (cuBLAS/cuBLASLt
      benchmarks; NVIDIA's MLPerf inference submissions imply similar).
    - ``moe_mfu`` 0.45: fused/grouped MoE GEMMs (SGLang's triton ``fused_moe_kernel``) are less
      efficient than dense GEMMs (small per-expert M, routing gather/scatter).
    - ``attn_mfu`` 0.55: FlashAttention-3 forward reaches 50-75% of bf16 peak on H100 (Shah et al.
      2024, FA3 paper: 740 TFLOP/s of 989 at head dim 128, lower with causal masks and short sequences).
    - ``mbu`` 0.80, ``kv_mbu`` 0.65: memory-bound decode GEMMs stream weights at ~80% of HBM
      bandwidth; paged KV reads are less regular (Databricks/MosaicML "LLM inference performance
      engineering" MBU figures of 60-80%).
    - ``comm_eff`` 0.70: NCCL/custom all-reduce bus bandwidth relative to NVLink peak.
    - ``step_overhead_s`` 0.9 ms: scheduler iteration + sampling + CUDA-graph replay per step with
      SGLang's overlap scheduler (SGLang's own reports of single-digit-% CPU overhead at ~10-30 ms steps).
    - ``per_req_overhead_s`` 6 us: per running request per step (batch tensors, output processing),
      divided by ``stream_interval`` for the streaming part.
    - ``eager_layer_s`` 120 us: Python + kernel launches of one transformer layer outside a CUDA
      graph (~10-15 kernels x 5-10 us on a busy Python thread; x1.5 for MoE layers). SGLang's
      motivation for CUDA graphs: eager decode of small models is launch-bound.
    - ``kernel_floor_s`` 6 us per layer: the minimum time of a layer's kernels at tiny batches.
    """
    gemm_mfu: float = 0.70
    moe_mfu: float = 0.45
    attn_mfu: float = 0.55
    mbu: float = 0.80
    kv_mbu: float = 0.65
    comm_eff: float = 0.70
    step_overhead_s: float = 0.0009
    per_req_overhead_s: float = 6e-6
    eager_layer_s: float = 120e-6
    kernel_floor_s: float = 6e-6

    def replace(self, **kw) -> "Efficiency":
        return Efficiency(**{**asdict(self), **kw})


HIDDEN_SPREAD = 0.30


def hidden_efficiency(seed: int, spread: float = HIDDEN_SPREAD) -> Efficiency:
    """Efficiency factors of an emulated endpoint's own engine: each documented default times a seeded
    draw from U(1 - spread, 1 + spread), achieved fractions capped below their peak. Deterministic per seed.

    Where an endpoint itself runs on the emulator (the demo, the benchmark suites) these play the part of
    a real GPU's unknown efficiencies: deployments never report them (``server_info`` shows knobs and
    version), and the proposers' surrogate (``agents.surrogate``) builds its own emulator from the
    documented defaults or a calibration on measurements, so it has a wrong model, as it would of a GPU."""
    if not 0 <= spread < 1:
        raise SpecError(f"hidden_factors_spread must be in [0, 1), got {spread}")
    rng = random.Random(f"hidden-factors-{seed}")
    drawn = {k: v * rng.uniform(1 - spread, 1 + spread) for k, v in asdict(Efficiency()).items()}
    return Efficiency(**{k: min(v, 0.95) if not k.endswith("_s") else v for k, v in drawn.items()})


def endpoint_efficiency(engine_options: dict[str, Any] | None) -> Efficiency | None:
    """The hidden factors an endpoint spec's ``engine_options`` ask for (``hidden_factors_seed``,
    ``hidden_factors_spread``), else None (the documented defaults)."""
    opts = engine_options or {}
    if opts.get("hidden_factors_seed") is None:
        return None
    return hidden_efficiency(int(opts["hidden_factors_seed"]), float(opts.get("hidden_factors_spread", HIDDEN_SPREAD)))


class StepCost:
    """Seconds per kernel class for one forward pass (one replica, all TP ranks in lockstep)."""
    __slots__ = ("gemm_s", "moe_s", "attn_s", "comm_s", "sample_s", "draft_s", "launch_s", "cpu_s")

    def __init__(self, gemm_s: float = 0.0, moe_s: float = 0.0, attn_s: float = 0.0, comm_s: float = 0.0,
                 sample_s: float = 0.0, draft_s: float = 0.0, launch_s: float = 0.0, cpu_s: float = 0.0):
        self.gemm_s, self.moe_s, self.attn_s, self.comm_s = gemm_s, moe_s, attn_s, comm_s
        self.sample_s, self.draft_s = sample_s, draft_s
        self.launch_s = launch_s  # eager-mode launch overhead (decode batch above the CUDA-graph max bs)
        self.cpu_s = cpu_s  # scheduler / batch preparation / output processing

    @property
    def gpu_s(self) -> float:
        return self.gemm_s + self.moe_s + self.attn_s + self.comm_s + self.sample_s + self.draft_s

    @property
    def total_s(self) -> float:
        return self.gpu_s + self.launch_s + self.cpu_s

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


class CostModel:
    """Prices one batch shape. Built once per deployment; ``step`` is called every iteration."""

    def __init__(self, model: ModelCard, hw: GPUSpec, *, tp: int, fp8_weights: bool, kv_bytes: float,
                 eff: Efficiency | None = None, cuda_graph_max_bs: int = 256, stream_interval: int = 1):
        self.m, self.hw, self.tp = model, hw, tp
        self.eff = eff or Efficiency()
        self.fp8 = fp8_weights
        self.wbytes = model.param_bytes(fp8_weights)
        self.gemm_peak = hw.fp8_flops if (fp8_weights and hw.has_fp8) else hw.bf16_flops
        self.kv_bytes = kv_bytes
        self.graph_bs = cuda_graph_max_bs
        self.stream_interval = stream_interval
        m = model
        self._dense_params = (m.layers * m.attn_params_per_layer + m.dense_mlp_params) / tp
        self._lm_params = m.vocab * m.hidden / tp
        self._expert_params = m.expert_params / tp
        self._kv_per_layer_token = m.kv_bytes_per_token(kv_bytes, tp) / m.layers
        self._attn_flop_per = 4.0 * m.heads * m.head_dim / tp  # QK^T and PV, 2 FLOPs per MAC
        self._n_global = m.n_global_layers
        self._n_sliding = m.layers - self._n_global
        self._ar_bytes_per_token = m.hidden * 2.0

        e, hw = self.eff, hw
        self._gemm_rate = self.gemm_peak * e.gemm_mfu
        self._moe_rate = self.gemm_peak * e.moe_mfu
        self._attn_rate = hw.bf16_flops * e.attn_mfu
        self._w_bw = hw.hbm_bw * e.mbu
        self._kv_bw = hw.hbm_bw * e.kv_mbu
        self._dense_bytes = (self._dense_params + self._lm_params) * self.wbytes
        self._moe_bytes_all = m.n_moe_layers * m.experts * self._expert_params * m.expert_param_bytes(fp8_weights)
        self._moe_flop_per_token = 2.0 * m.active_experts * self._expert_params * m.n_moe_layers
        self._miss = 1.0 - m.active_experts / m.experts if m.is_moe else 1.0
        self._floor = m.layers * e.kernel_floor_s
        self._sample_per_logit = m.vocab * 4.0 / self._w_bw / tp
        self._launch = m.layers * e.eager_layer_s * (1.5 if m.is_moe else 1.0)  # MoE layers launch more kernels
        self._req_cpu = e.per_req_overhead_s * (0.5 + 0.5 / stream_interval)

    def moe_coverage(self, tokens: float) -> float:
        """Expected fraction of experts touched when ``tokens`` tokens each pick top-k of E."""
        if not self.m.is_moe or tokens <= 0:
            return 0.0
        return 1.0 - self._miss ** tokens

    def step(self, *, prefill_tokens: int = 0, prefill_seqs: int = 0, prefill_attn_work: float = 0.0,
             prefill_attn_work_swa: float = 0.0, prefill_ctx_read: float = 0.0, prefill_ctx_read_swa: float = 0.0,
             decode_reqs: int = 0, decode_width: int = 1, decode_ctx: float = 0.0, decode_ctx_swa: float = 0.0,
             draft_steps: int = 0, draft_width: int = 1, n_running: int = 0) -> StepCost:
        """Price one forward pass.

        prefill_attn_work = sum over prefill segments of new x (prior + new/2) (token pairs attended,
        full-attention layers); *_swa the same with the context clipped to the sliding window.
        decode_ctx = sum of decode requests' context lengths (*_swa clipped). decode_width is the
        tokens scored per decode request (1, or the verify width under speculative decoding).
        """
        m, e = self.m, self.eff
        dec_tokens = decode_reqs * decode_width
        tokens = prefill_tokens + dec_tokens
        if tokens <= 0:
            return StepCost(cpu_s=e.step_overhead_s)
        logits = prefill_seqs + dec_tokens
        gemm_s = max((2.0 * tokens * self._dense_params + 2.0 * logits * self._lm_params) / self._gemm_rate,
                     self._dense_bytes / self._w_bw) + self._floor
        moe_s = 0.0
        if m.experts:
            moe_s = max(tokens * self._moe_flop_per_token / self._moe_rate,
                        self._moe_bytes_all * (1.0 - self._miss ** tokens) / self._w_bw)
        pairs = (self._n_global * (prefill_attn_work + decode_width * decode_ctx)
                 + self._n_sliding * (prefill_attn_work_swa + decode_width * decode_ctx_swa))
        kv_read = (self._n_global * (decode_ctx + prefill_ctx_read)
                   + self._n_sliding * (decode_ctx_swa + prefill_ctx_read_swa) + m.layers * tokens)  # + new KV writes
        attn_s = max(self._attn_flop_per * pairs / self._attn_rate, self._kv_per_layer_token * kv_read / self._kv_bw)
        comm_s = 0.0
        if self.tp > 1:
            per_ar = (self.hw.link_latency_s
                      + 2.0 * (self.tp - 1) / self.tp * tokens * self._ar_bytes_per_token / (self.hw.link_bw * e.comm_eff))
            comm_s = 2 * m.layers * per_ar
        draft_s = 0.0
        if draft_steps:  # one-layer draft head + lm_head per draft step, at the tree width
            layer = self._dense_params / m.layers
            draft_tokens = decode_reqs * draft_width
            one = max(2.0 * draft_tokens * (layer + self._lm_params) / self._gemm_rate,
                      (layer + self._lm_params) * self.wbytes / self._w_bw) + 8 * e.kernel_floor_s
            draft_s = draft_steps * one
        launch_s = 0.0
        if prefill_tokens == 0 and decode_reqs > self.graph_bs:
            launch_s = self._launch * (1 + draft_steps * 0.1)
        cpu_s = e.step_overhead_s + (n_running if n_running > decode_reqs else decode_reqs) * self._req_cpu
        return StepCost(gemm_s, moe_s, attn_s, comm_s, 15e-6 + logits * self._sample_per_logit, draft_s, launch_s, cpu_s)


# ------------------------------------------------------------------------------------- resolution

def default_chunked_prefill_size(hw: GPUSpec) -> int:
    """SGLang 0.5.23 memory_hook.handle_gpu_memory_settings: chunk size by GPU memory."""
    g = hw.memory_gib
    if g < 20:
        return 2048
    if g < 60:
        return 4096
    if g < 160:
        return 8192
    return 16384


def default_cuda_graph_max_bs(hw: GPUSpec, tp: int) -> int:
    """SGLang 0.5.23 memory_hook: decode CUDA-graph max batch size by GPU memory and TP."""
    g = hw.memory_gib
    if g < 20:
        return 8
    if g < 35:
        return 48 if tp < 4 else 160
    if g < 60:
        return 32 if tp < 4 else 160
    if g < 90:
        return 256 if tp < 4 else 512
    if g < 160:
        return 256 if tp < 4 else 512
    return 512


def default_mem_fraction_static(hw: GPUSpec, *, chunked_prefill_size: int, tp: int, cuda_graph_max_bs: int) -> float:
    """SGLang 0.5.23 memory_hook: (gpu_mem - reserved) / gpu_mem with reserved_MB =
    512 + 1.5 x max(chunk, 2048) + tp/8 x 1024 + 2 MB per decode graph bs; at least 10 GiB on GPUs > 60 GiB."""
    total_mb = hw.memory_gib * 1024
    reserved = 512 + 1.5 * max(chunked_prefill_size, 2048) + tp / 8 * 1024 + 2 * cuda_graph_max_bs
    if hw.memory_gib > 60:
        reserved = max(reserved, 10 * 1024)
    return round((total_mb - reserved) / total_mb, 3)


def kv_capacity_tokens(model: ModelCard, hw: GPUSpec, *, tp: int, mem_fraction_static: float,
                       fp8_weights: bool, kv_bytes: float, page_size: int, draft: bool = False) -> int:
    """Tokens the KV pool holds on one replica: (memory x fraction - weights) / KV bytes per token."""
    wbytes = model.param_bytes(fp8_weights)
    weights = model.weights_bytes(fp8_weights) / tp
    if draft:  # one-layer EAGLE head + its own lm_head copy
        weights += (model.attn_params_per_layer + 3 * model.hidden * max(model.ffn, 4 * model.hidden)
                    + model.vocab * model.hidden) * wbytes / tp
    pool = hw.memory_gib * GiB * mem_fraction_static - weights
    per_token = model.kv_bytes_per_token(kv_bytes, tp)
    tokens = int(pool // per_token) if pool > 0 else 0
    tokens -= tokens % max(1, page_size)
    if tokens < 2048:
        raise SpecError(
            f"{model.name} does not fit on {hw.name} x tp={tp} with mem_fraction_static={mem_fraction_static}: "
            f"weights {weights / GiB:.1f} GiB leave {max(pool, 0) / GiB:.2f} GiB for the KV cache "
            f"({tokens} tokens); raise tp_size, use quantization=fp8 or a larger GPU")
    return tokens


def weight_gib(model: ModelCard, *, tp: int, fp8_weights: bool) -> float:
    return model.weights_bytes(fp8_weights) / tp / GiB
