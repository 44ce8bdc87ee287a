"""Owns the emulator's cost model: iteration time from FLOPs and bytes (a per-kernel-class roofline),
KV-cache capacity, and the SGLang-like resolution of memory-dependent defaults.

Each forward pass is split into the kernel classes a profile shows — dense GEMMs (QKV/O
projections, dense MLP, lm_head), MoE expert GEMMs, attention, TP all-reduce, sampling — and each
class costs ``max(FLOPs / (peak x MFU), bytes / (HBM bandwidth x MBU))``: the roofline, with
efficiency factors (``Efficiency``) fitted on published real-GPU measurements
(``emulator.validation``, ``benchmarks/bench_emulator_fidelity.py``). The mechanisms beyond the roofline,
each after what SGLang does:

- **Overlap scheduler** (SGLang's default, ``managers/scheduler.py`` ``event_loop_overlap``: the CPU
  schedules batch n+1 and processes batch n-1's outputs while the GPU runs batch n; LMSYS SGLang v0.4
  blog "zero-overhead batch scheduler"): a step lasts ``max(GPU, CPU)``; with
  ``disable_overlap_schedule`` (and under speculative decoding, which SGLang's ServerArgs runs without
  the overlap scheduler unless spec v2 is enabled) the CPU work adds serially.
- **CUDA graphs** (``model_executor/cuda_graph_runner.py``, captured sizes from ServerArgs
  ``_generate_cuda_graph_batch_sizes``: 1, 2, 4, 8, 12, 16..256 step 8, 272..496 step 16, 512.. step 32,
  up to ``cuda_graph_max_bs``): a decode batch replays the graph of the smallest captured size that holds it,
  so its GEMMs, MoE and sampling run at the padded size; a larger batch, any prefill or mixed step, and
  every step under ``disable_cuda_graph`` run eagerly, their kernels issued one by one from Python
  (``eager_layer_s`` per layer), which the GPU overlaps with execution (``max(GPU, launch)``).
- **Per-request decode cost**: attention kernels do per-sequence work (split-KV scheduling, page-table
  reads, a tile per sequence and KV head) beside the KV bytes they read: ``decode_req_layer_s`` per decoding
  request per attention layer, why decode steps grow with the running batch faster than KV bytes alone.
- **fp8**: fp8 weights halve weight bytes; on GPUs with fp8 tensor cores the GEMMs run at the fp8 peak times
  ``fp8_mfu`` (block-quantized fp8 GEMMs with per-token-group activation scales stay far below the dense fp8
  peak) and each layer pays ``fp8_layer_s`` for activation-quantization kernels; without fp8 tensor cores
  (A100) they run as weight-only w8a16 at the bf16 peak times ``w8a16_mfu``. An fp8 KV cache (``kv_cache_dtype=fp8_*``) halves
  the KV bytes every attention kernel reads (decode and prefill) and doubles the tokens that fit.
- **MLA** (DeepSeek-V2/V3, card fields from ``emulator.card``): the KV cache holds one latent of
  ``kv_lora_rank + qk_rope_head_dim`` per token and layer, replicated on every TP rank; decode attention
  runs absorbed over the latent (``4 x kv_lora_rank + 2 x qk_rope_head_dim`` FLOPs per head and token pair),
  prefill as plain MHA over the decompressed heads (``2 x (qk head dim + v head dim)``).
- **Per-request fixed latency** (HTTP, tokenization in the TokenizerManager, the ZMQ hops, detokenization and
  streaming): ``request_in_s`` before the scheduler sees a request, ``request_out_s`` from a token's step to
  the client; they add to TTFT and E2E, not to inter-token gaps.

The MoE weight traffic grows with the batch: T tokens each picking k of E experts touch an
expected fraction ``1 - (1 - k/E)^T`` of the experts, so decode of a small batch reads few expert
weights and a large batch reads nearly all of them (why MoE decode is costlier per step than its
"active parameters" suggest).
"""
from __future__ import annotations

import bisect
import hashlib
import json
import random
from dataclasses import asdict, dataclass
from typing import Any

from autoresearch_dagster.emulator.catalog import GiB, GPUSpec, ModelCard
from autoresearch_dagster.spec import SpecError


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak, and CPU and fixed costs. Priors and their sources (the defaults of the
    factors marked FITTED below are the values fitted on the validation table's fit half):

    - ``gemm_mfu``: bf16 GEMMs in a serving forward pass, as a fraction of the dense peak, on the reference GPU
      (``GPUSpec.mfu_scale`` 1.0: the A100); MAMF benchmarks reach 80-86% on ideal shapes, a serving engine's
      prefill far less (GPUStack's vLLM bf16 random-prompt runs: about 55% on A100, 30% on H100).
    - ``fp8_mfu``: fraction of the fp8 dense peak block-quantized fp8 GEMMs reach (per-token-group activation
      scales, DeepGEMM/triton block kernels), before the GPU's ``mfu_scale``.
    - ``w8a16_mfu``: fraction of the bf16 peak weight-only fp8 GEMMs reach on GPUs without fp8 tensor cores
      (A100: vLLM's Marlin kernels dequantize in the GEMM; SGLang has no fp8 path there).
    - ``moe_mfu``: fused/grouped MoE GEMMs (SGLang's triton ``fused_moe_kernel``) are less efficient than
      dense GEMMs (small per-expert M, routing gather/scatter).
    - ``moe_n_half``: the per-rank expert width at which grouped MoE GEMMs reach half of ``moe_mfu``: tensor
      parallelism splits each expert's intermediate size over the ranks (Qwen3-235B's 1536 over 8 ranks is 192
      columns), and a GEMM a tile or two wide leaves most of the GPU's SMs idle or padded (the fused MoE kernels
      tile N by 64-256); the rate scales by n / (n + moe_n_half) for a per-rank width n. 0: no width effect.
    - ``attn_mfu``: FlashAttention-3 forward reaches 50-75% of bf16 peak on H100 (Shah et al. 2024: 740
      TFLOP/s of 989 at head dim 128, lower with causal masks and short sequences).
    - ``mbu``, ``kv_mbu``: memory-bound decode GEMMs stream weights at 60-80% of HBM bandwidth, paged KV
      reads less regularly (Databricks/MosaicML "LLM inference performance engineering" MBU figures).
    - ``comm_eff``: NCCL/custom all-reduce bus bandwidth relative to NVLink peak.
    - ``step_overhead_s``: scheduler iteration + batch preparation + output processing per step (CPU).
    - ``per_req_overhead_s``: CPU per running request per step (batch tensors, output processing),
      the streaming part divided by ``stream_interval``.
    - ``eager_layer_s``: Python + kernel launches of one transformer layer outside a CUDA graph (~10-15
      kernels x 5-10 us; x1.5 for MoE layers).
    - ``kernel_floor_s``: the minimum time of a layer's kernels at tiny batches.
    - ``decode_req_layer_s``: GPU time per decoding request per attention layer beside its KV bytes.
    - ``fp8_layer_s``: activation-quantization kernels per layer under fp8 weights (fp8-capable GPUs).
    - ``request_in_s`` / ``request_out_s``: fixed latency of a request before the scheduler sees it (HTTP,
      chat template, tokenization, ZMQ) and of a token from its step to the client (detokenizer, ZMQ,
      HTTP streaming).
    - ``frontend_req_s``: CPU time of one request in the server's single frontend process (SGLang's
      TokenizerManager, vLLM's API server: HTTP parsing, chat template, tokenization, all on one event loop),
      so requests reach the scheduler one after another, at most ``1 / frontend_req_s`` per second, however
      many arrive at once (an offline burst of short prompts queues here).
    - ``vllm_request_in_s``: what vLLM's OpenAI server adds to ``request_in_s`` (its API server process hands
      requests to the engine core over ZMQ and streams back through an output processor; GPUStack's Qwen3-8B H100
      latency runs show vLLM 0.11's TTFT at one request in flight about 30 ms above SGLang's). Used where the
      emulator stands in for a vLLM server (``emulator.validation`` for vLLM runs).
    - ``vllm_frontend_req_s``: what vLLM's API server process adds to ``frontend_req_s`` per request (it also
      detokenizes and streams every request's output on that one process, where SGLang has a detokenizer process):
      an offline burst of short prompts is paced by it. Used for vLLM runs, like ``vllm_request_in_s``.
    """
    # FITTED (bench_emulator_fidelity.py --fit, on the 49 'fit' points of benchmarks/data/emulator_validation.json:
    # the first table's 43-point fit half and the six gpt-oss-20b H100 runs added on 2026-12-04; neither the report
    # half nor the holdout points saw a fit): gemm_mfu, moe_mfu, moe_n_half, fp8_mfu, w8a16_mfu, attn_mfu, mbu,
    # fp8_layer_s, decode_req_layer_s, request_in_s, vllm_request_in_s, vllm_frontend_req_s, step_overhead_s,
    # per_req_overhead_s, and the H100's GPUSpec scales (cost model 5). kv_mbu is 0.65 x the A100 streaming scale of
    # an earlier fit, held since; frontend_req_s is a prior (0.5 ms): SGLang's runs in the table cannot tell it from
    # GPU work. vLLM's 128-token offline bursts pin vllm_frontend_req_s (4.2 ms: vLLM 0.11's one API server process
    # detokenizes and streams too). The others are priors.
    gemm_mfu: float = 0.5352
    moe_mfu: float = 0.4746
    attn_mfu: float = 0.6265
    mbu: float = 0.5931
    kv_mbu: float = 0.538
    comm_eff: float = 0.70
    step_overhead_s: float = 0.000302
    per_req_overhead_s: float = 1.46e-5
    eager_layer_s: float = 120e-6
    kernel_floor_s: float = 6e-6
    fp8_mfu: float = 0.5064
    w8a16_mfu: float = 0.3397
    decode_req_layer_s: float = 3e-9
    fp8_layer_s: float = 47.6e-6
    request_in_s: float = 0.0201
    request_out_s: float = 0.008
    frontend_req_s: float = 0.0005
    vllm_request_in_s: float = 0.0176
    vllm_frontend_req_s: float = 0.00416
    moe_n_half: float = 340.7

    def replace(self, **kw) -> "Efficiency":
        return Efficiency(**{**asdict(self), **kw})


HIDDEN_SPREAD = 0.30
# Efficiency fields that are not achieved fractions of a peak (seconds, and a width in GEMM columns): never capped
NOT_FRACTIONS = frozenset(f for f in Efficiency.__dataclass_fields__ if f.endswith("_s")) | {"moe_n_half"}

# Bump when the cost model's mechanics change what a config costs (a new mechanism, a changed formula), so
# results cached on emulator numbers (benchmarks/bench_search_truth.json) are recomputed, not reused.
# 2: eb9b54c (overlap scheduler, CUDA-graph padding, per-request decode cost, fp8 rates, fixed request latency).
# 3: a mixed step's decodes come out of the chunk budget (core.py, SGLang's mixed_with_decode_tokens).
# 4: per-GPU GEMM / HBM scales (GPUSpec.mfu_scale / mbu_scale), one serial frontend process (frontend_req_s), and
#    the factors refitted on the 80-point validation table's fit half.
# 5: grouped MoE GEMMs lose rate with the per-rank expert width (moe_n_half), vLLM's API server costs per request
#    (vllm_frontend_req_s), and the factors refitted on the 49 fit points.
# 6: an endpoint's hidden factors no longer cap moe_n_half at 0.95 (the cap is for fractions of a peak): under 5
#    every hidden MoE engine ran its narrow experts at full rate.
# 7: the H200 takes the H100's fitted GEMM / HBM scales (catalog.SAME_DIE: one die), where it had the A100's 1.0.
COST_MODEL_VERSION = 7


def cost_model_fingerprint() -> str:
    """Short hash of what emulated numbers depend on besides the config: ``COST_MODEL_VERSION``, the default
    ``Efficiency`` factors, the hidden factors' spread (emulated endpoints draw theirs around the defaults) and
    the catalog's device fits where there are any (``catalog.DEVICE_FITS``)."""
    from autoresearch_dagster.emulator.catalog import DEVICE_FITS

    parts: dict[str, Any] = {"version": COST_MODEL_VERSION, "efficiency": asdict(Efficiency()),
                             "hidden_spread": HIDDEN_SPREAD}
    if DEVICE_FITS:  # GPU numbers fitted to a device probe price every step on that GPU anew
        parts["device_fits"] = DEVICE_FITS
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


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
    return Efficiency(**{k: min(v, 0.95) if k not in NOT_FRACTIONS else v for k, v in drawn.items()})


def endpoint_efficiency(engine_options: dict[str, Any] | None) -> Efficiency | None:
    """The hidden factors an endpoint spec's ``engine_options`` ask for (``hidden_factors_seed``,
    ``hidden_factors_spread``), else None (the documented defaults)."""
    opts = engine_options or {}
    if opts.get("hidden_factors_seed") is None:
        return None
    return hidden_efficiency(int(opts["hidden_factors_seed"]), float(opts.get("hidden_factors_spread", HIDDEN_SPREAD)))


class StepCost:
    """Seconds per kernel class for one forward pass (one replica, all TP ranks in lockstep)."""
    __slots__ = ("gemm_s", "moe_s", "attn_s", "comm_s", "sample_s", "draft_s", "launch_s", "cpu_s", "overlap")

    def __init__(self, gemm_s: float = 0.0, moe_s: float = 0.0, attn_s: float = 0.0, comm_s: float = 0.0,
                 sample_s: float = 0.0, draft_s: float = 0.0, launch_s: float = 0.0, cpu_s: float = 0.0,
                 overlap: bool = False):
        self.gemm_s, self.moe_s, self.attn_s, self.comm_s = gemm_s, moe_s, attn_s, comm_s
        self.sample_s, self.draft_s = sample_s, draft_s
        self.launch_s = launch_s  # eager-mode kernel launches (no CUDA graph for this step)
        self.cpu_s = cpu_s  # scheduler / batch preparation / output processing
        self.overlap = overlap  # the overlap scheduler hides CPU work behind the GPU

    @property
    def gpu_s(self) -> float:
        return self.gemm_s + self.moe_s + self.attn_s + self.comm_s + self.sample_s + self.draft_s

    @property
    def total_s(self) -> float:
        """Wall time of the step: kernels run while Python issues them (eager launches overlap execution);
        the overlap scheduler also hides scheduling and output processing, else they add serially."""
        if self.overlap:
            return max(self.gpu_s, self.launch_s + self.cpu_s)
        return max(self.gpu_s, self.launch_s) + self.cpu_s

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__ if k != "overlap"}


def cuda_graph_batch_sizes(max_bs: int, *, speculative: bool = False) -> tuple[int, ...]:
    """The decode batch sizes SGLang captures as CUDA graphs (ServerArgs ``_generate_cuda_graph_batch_sizes``,
    padding on), up to ``max_bs``; ``max_bs`` itself is captured too (``cuda_graph_runner`` adds the largest
    batch a small pool allows)."""
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return tuple(sorted({b for b in sizes if b <= max_bs} | ({max_bs} if max_bs >= 1 else set())))


class CostModel:
    """Prices one batch shape. Built once per deployment; ``step`` is called every iteration.

    ``cuda_graph_bs``: the captured decode batch sizes (default: SGLang's list up to ``cuda_graph_max_bs``;
    empty = ``disable_cuda_graph``). ``overlap``: the overlap scheduler is on."""

    def __init__(self, model: ModelCard, hw: GPUSpec, *, tp: int, fp8_weights: bool, kv_bytes: float,
                 eff: Efficiency | None = None, cuda_graph_max_bs: int = 256, stream_interval: int = 1,
                 cuda_graph_bs: tuple[int, ...] | None = None, overlap: bool = True):
        self.m, self.hw, self.tp = model, hw, tp
        self.eff = eff or Efficiency()
        self.fp8 = fp8_weights
        self.wbytes = model.param_bytes(fp8_weights)
        fp8_gemm = fp8_weights and hw.has_fp8  # w8a8 on fp8 tensor cores; else weight-only (w8a16) at bf16 rate
        self.gemm_peak = hw.fp8_flops if fp8_gemm else hw.bf16_flops
        self.kv_bytes = kv_bytes
        self.graph_sizes = cuda_graph_batch_sizes(cuda_graph_max_bs) if cuda_graph_bs is None else tuple(sorted(cuda_graph_bs))
        self.graph_bs = self.graph_sizes[-1] if self.graph_sizes else 0
        self.overlap = overlap
        self.stream_interval = stream_interval
        m = model
        self._dense_params = (m.attn_params + m.dense_mlp_params) / tp
        self._lm_params = m.vocab * m.hidden / tp
        self._expert_params = m.expert_params / tp
        # KV bytes per token and softmax-attention layer the attention kernels read (DSA's index keys apart)
        self._idx_per_layer_token = m.index_key_bytes
        self._kv_per_layer_token = (m.kv_bytes_per_token(kv_bytes, tp)
                                    - m.n_index_layers * self._idx_per_layer_token) / m.attn_layers
        heads = m.heads / tp  # query heads are split over TP ranks (MLA too; its latent KV is not)
        if m.is_mla:  # absorbed decode over the latent; prefill as MHA over decompressed heads
            self._attn_flop_decode = heads * (4.0 * m.kv_lora_rank + 2.0 * m.qk_rope_head_dim)
            self._attn_flop_prefill = heads * 2.0 * (m.head_dim + m.v_head_dim)
        else:  # QK^T and PV, 2 FLOPs per MAC
            self._attn_flop_decode = self._attn_flop_prefill = 4.0 * heads * m.head_dim
        self._n_global = m.n_global_layers
        self._n_sliding = m.attn_layers - self._n_global  # sliding-window layers, or DSA's top-k layers
        # Gated DeltaNet layers (per rank): the chunked delta rule costs ~6 x k_dim x v_dim FLOPs per value head and
        # token (state decay/update and readout) plus the intra-chunk attention of 64-token chunks in prefill; each
        # step reads and writes every scheduled request's recurrent state once per layer
        self._n_linear = m.linear_layers
        if m.linear_layers:
            vh, dk, dv = m.linear_v_heads / tp, m.linear_k_dim, m.linear_v_dim
            self._lin_flop_decode = vh * 6.0 * dk * dv
            self._lin_flop_prefill = self._lin_flop_decode + vh * 2.0 * 64 * (dk + dv)
            self._lin_state_layer = m.linear_state_bytes_per_request(tp) / m.linear_layers
        # DSA's lightning indexer (replicated on every rank): index_heads dot products of index_head_dim per query
        # and prior token, in fp8 where the GPU has fp8 tensor cores
        self._idx_flop = 2.0 * m.index_heads * m.index_head_dim if m.index_topk else 0.0
        self._ar_bytes_per_token = m.hidden * 2.0

        e, hw = self.eff, hw
        mfu = e.fp8_mfu if fp8_gemm else e.w8a16_mfu if fp8_weights else e.gemm_mfu
        self._gemm_rate = self.gemm_peak * mfu * hw.mfu_scale
        self._moe_rate = self._gemm_rate * (e.moe_mfu / e.gemm_mfu)  # grouped GEMMs' relative loss kept
        if m.is_moe and e.moe_n_half > 0:  # narrow per-rank experts (TP splits the intermediate size) run worse
            n = m.expert_ffn / tp
            self._moe_rate *= n / (n + e.moe_n_half)
        self._attn_rate = hw.bf16_flops * e.attn_mfu  # FlashAttention kernels: attn_mfu alone (see GPUSpec.mfu_scale)
        self._idx_rate = (hw.fp8_flops if hw.has_fp8 else hw.bf16_flops) * e.attn_mfu
        self._w_bw = hw.hbm_bw * e.mbu * hw.mbu_scale
        self._kv_bw = hw.hbm_bw * e.kv_mbu * hw.mbu_scale
        self._dense_bytes = (self._dense_params + self._lm_params) * self.wbytes
        self._moe_bytes_all = m.n_moe_layers * m.experts * self._expert_params * m.expert_param_bytes(fp8_weights)
        self._moe_flop_per_token = 2.0 * m.active_experts * self._expert_params * m.n_moe_layers
        self._miss = 1.0 - m.active_experts / m.experts if m.is_moe else 1.0
        self._floor = m.layers * (e.kernel_floor_s + (e.fp8_layer_s if fp8_gemm else 0.0))
        self._sample_per_logit = m.vocab * 4.0 / self._w_bw / tp
        self._launch = m.layers * e.eager_layer_s * (1.5 if m.is_moe else 1.0)  # MoE layers launch more kernels
        self._req_cpu = e.per_req_overhead_s * (0.5 + 0.5 / stream_interval)
        self._req_attn = m.layers * e.decode_req_layer_s

    def moe_coverage(self, tokens: float) -> float:
        """Expected fraction of experts touched when ``tokens`` tokens each pick top-k of E."""
        if not self.m.is_moe or tokens <= 0:
            return 0.0
        return 1.0 - self._miss ** tokens

    def graph_batch(self, decode_reqs: int) -> int | None:
        """The captured batch size a decode batch of ``decode_reqs`` replays (None: it runs eagerly)."""
        if decode_reqs > self.graph_bs:
            return None
        return self.graph_sizes[bisect.bisect_left(self.graph_sizes, decode_reqs)]

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
        overlap = self.overlap and not draft_steps
        if tokens <= 0:
            return StepCost(cpu_s=e.step_overhead_s, overlap=overlap)
        graph = self.graph_batch(decode_reqs) if prefill_tokens == 0 else None
        if graph is not None:  # the replayed graph computes the padded batch
            tokens = dec_tokens = graph * decode_width
        logits = prefill_seqs + dec_tokens
        gemm_s = max((2.0 * tokens * self._dense_params + 2.0 * logits * self._lm_params) / self._gemm_rate,
                     self._dense_bytes / self._w_bw) + self._floor
        moe_s = 0.0
        if m.experts:
            moe_s = max(tokens * self._moe_flop_per_token / self._moe_rate,
                        self._moe_bytes_all * (1.0 - self._miss ** tokens) / self._w_bw)
        flops = (self._attn_flop_prefill * (self._n_global * prefill_attn_work + self._n_sliding * prefill_attn_work_swa)
                 + self._attn_flop_decode * decode_width * (self._n_global * decode_ctx + self._n_sliding * decode_ctx_swa))
        kv_read = (self._n_global * (decode_ctx + prefill_ctx_read)
                   + self._n_sliding * (decode_ctx_swa + prefill_ctx_read_swa) + m.attn_layers * tokens)  # + new KV writes
        attn_s = max(flops / self._attn_rate, self._kv_per_layer_token * kv_read / self._kv_bw)
        attn_s += decode_reqs * self._req_attn
        if self._n_linear:
            lin_flops = self._n_linear * (prefill_tokens * self._lin_flop_prefill + dec_tokens * self._lin_flop_decode)
            lin_bytes = self._n_linear * self._lin_state_layer * 2.0 * (decode_reqs + prefill_seqs)
            attn_s += max(lin_flops / self._attn_rate, lin_bytes / self._kv_bw)
        if self._idx_flop:  # the indexer scores the whole context, whatever top-k the attention keeps
            idx_flops = m.n_index_layers * self._idx_flop * (prefill_attn_work + decode_width * decode_ctx)
            idx_bytes = m.n_index_layers * self._idx_per_layer_token * (decode_ctx + prefill_ctx_read + tokens)
            attn_s += max(idx_flops / self._idx_rate, idx_bytes / self._kv_bw)
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
        launch_s = 0.0 if graph is not None else self._launch * (1 + draft_steps * 0.1)
        cpu_s = e.step_overhead_s + (n_running if n_running > decode_reqs else decode_reqs) * self._req_cpu
        return StepCost(gemm_s, moe_s, attn_s, comm_s, 15e-6 + logits * self._sample_per_logit, draft_s, launch_s, cpu_s,
                        overlap)


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


# SGLang's --mamba-full-memory-ratio (default 0.9, the knob ``mamba_full_memory_ratio``): a hybrid linear-attention model's cache memory splits into recurrent
# states and full-attention KV in this ratio (ServerArgs; model_runner sizes max_mamba_cache_size from it), and a
# request runs only while it holds a state slot. vLLM pages states and KV from one pool; the same split stands in.
MAMBA_FULL_MEMORY_RATIO = 0.9


def _weights_on_gpu(model: ModelCard, *, tp: int, fp8_weights: bool, draft: bool) -> float:
    weights = model.weights_bytes(fp8_weights) / tp
    if draft:  # one-layer EAGLE head + its own lm_head copy
        weights += (model.attn_params_per_layer + 3 * model.hidden * max(model.ffn, 4 * model.hidden)
                    + model.vocab * model.hidden) * model.param_bytes(fp8_weights) / tp
    return weights


def linear_state_slots(model: ModelCard, hw: GPUSpec, *, tp: int, mem_fraction_static: float,
                       fp8_weights: bool, draft: bool = False, state_ratio: float = MAMBA_FULL_MEMORY_RATIO) -> int | None:
    """Requests whose recurrent states fit in a hybrid model's state pool (None: the model has no linear layers);
    ``state_ratio`` is the knob ``mamba_full_memory_ratio``."""
    if not model.linear_layers:
        return None
    pool = hw.memory_gib * GiB * mem_fraction_static - _weights_on_gpu(model, tp=tp, fp8_weights=fp8_weights,
                                                                         draft=draft)
    share = pool * state_ratio / (1.0 + state_ratio)
    return max(1, int(share // model.linear_state_bytes_per_request(tp)))


def kv_capacity_tokens(model: ModelCard, hw: GPUSpec, *, tp: int, mem_fraction_static: float,
                       fp8_weights: bool, kv_bytes: float, page_size: int, draft: bool = False,
                       state_ratio: float = MAMBA_FULL_MEMORY_RATIO) -> int:
    """Tokens the KV pool holds on one replica: (memory x fraction - weights) / KV bytes per token (a hybrid model's
    KV gets 1 / (1 + ``state_ratio``) of that memory, its recurrent states the rest)."""
    weights = _weights_on_gpu(model, tp=tp, fp8_weights=fp8_weights, draft=draft)
    pool = hw.memory_gib * GiB * mem_fraction_static - weights
    if model.linear_layers:  # the recurrent-state pool takes its share first (SGLang's mamba_full_memory_ratio)
        pool /= 1.0 + state_ratio
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
