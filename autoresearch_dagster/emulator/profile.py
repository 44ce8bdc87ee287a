"""Owns the emulator's profiles: Chrome-trace JSON in the shape PyTorch's profiler writes.

SGLang's ``/start_profile`` produces one ``{profile_id}-TP-{rank}.trace.json.gz`` per rank, written
by ``torch.profiler``: a ``traceEvents`` list of complete events (``ph: "X"``, ``ts``/``dur`` in
microseconds) with ``cat: "kernel"`` on the GPU (pid = device, tid = stream), ``cat: "cpu_op"`` /
``"user_annotation"`` / ``"cuda_runtime"`` on the host, plus ``ph: "M"`` metadata naming processes
and threads. The emulator lays each step's priced kernel classes out per layer with the kernel
names real Hopper/Ampere runs show, the scheduler's CPU range before the GPU work and the launch
gaps between kernels, so one parser reads both.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING

from autoresearch_dagster.outputs.files import atomic_write_bytes

if TYPE_CHECKING:
    from autoresearch_dagster.emulator.core import EngineCore, Step

HOST_PID = 4242
HOST_TID = 4242
GPU_STREAM = 7
GRAPH_GAP_S = 1.0e-6  # kernel-to-kernel gap inside a CUDA graph


def _names(core: "EngineCore") -> dict[str, str]:
    hopper = core.hw.name in ("H100", "H200")
    blackwell = core.hw.name == "B200"
    fp8 = core.resolved.fp8_weights and core.hw.has_fp8
    if fp8:
        gemm = ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
                if hopper else "cutlass3x_sm100_tensorop_s256x128x64gemm_e4m3_e4m3_f32_bf16_bf16_256x128x64_1x1x1_0_tnn_align16_2sm"
                if blackwell else "sm89_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x64_stage3_warpsize2x2x1_tensor16x8x32_kernel")
    elif hopper:
        gemm = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
    elif blackwell:
        gemm = "nvjet_tst_256x128_64x4_2x1_2cta_v_bz_TNN"
    else:
        gemm = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn"
    if hopper:
        prefill_attn = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<256, 128, 64, 4, false, false, cutlass::bfloat16_t>, true, false>"
        decode_attn = "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<256, 64, 128, 4, false, false, cutlass::bfloat16_t>, true>"
    else:
        prefill_attn = "BatchPrefillWithPagedKVCacheKernel<MaskMode::kCausal, 256u, PosEncodingMode::kNone, __nv_bfloat16>"
        decode_attn = "BatchDecodeWithPagedKVCacheKernel<PosEncodingMode::kNone, 256u, 2u, 4u, __nv_bfloat16>"
    return {
        "gemm": gemm, "prefill_attn": prefill_attn, "decode_attn": decode_attn,
        "moe": "fused_moe_kernel", "moe_align": "moe_align_block_size_kernel",
        "moe_gate": "void topkGatingSoftmax<float, 8, 128, 4, 16, int>",
        "norm": "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>",
        "act": "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>",
        "rope": "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<false, 128u, 8u, 16u, __nv_bfloat16, long>",
        "allreduce": ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>" if core.knobs["tp_size"] <= 8
                      else "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
        "sample": "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)1, "
                  "(cub::BlockReduceAlgorithm)2, 4u, true, float, int>",
        "softmax": "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>",
        "logits": gemm,
    }


def step_kernels(step: "Step", core: "EngineCore") -> list[tuple[str, str, float, float, str]]:
    """(name, cat, start_offset_s, dur_s, category) for one step; offsets from the step start."""
    c = step.cost
    if c is None or step.duration_s <= 0:
        return []
    scale = step.duration_s / c.total_s if c.total_s > 0 else 1.0
    m = core.model
    names = _names(core)
    L = m.layers
    out: list[tuple[str, str, float, float, str]] = []
    cpu = c.cpu_s * scale
    out.append(("Scheduler.get_next_batch_to_run", "user_annotation", 0.0, cpu * 0.6, "cpu"))
    out.append(("Scheduler.process_batch_result", "user_annotation", cpu * 0.6, cpu * 0.4, "cpu"))
    t = cpu
    out.append(("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", t, 4e-6, "memcpy"))
    t += 4e-6 + GRAPH_GAP_S
    launch_gap = (c.launch_s * scale / (L * 8)) if c.launch_s else 0.0
    gap = GRAPH_GAP_S + launch_gap
    lm_frac = m.vocab * m.hidden / max(1, m.attn_params + m.dense_mlp_params + m.vocab * m.hidden)
    gemm_layer = c.gemm_s * scale * (1 - lm_frac) / L
    attn_share = m.attn_params_per_layer / max(1, m.attn_params_per_layer + m.dense_mlp_params / L)
    attn = c.attn_s * scale / L
    moe = c.moe_s * scale / max(1, m.n_moe_layers) if m.is_moe else 0.0
    comm = c.comm_s * scale / (2 * L) if c.comm_s else 0.0
    attn_name = names["decode_attn"] if step.kind == "decode" else names["prefill_attn"]
    small = 2e-6

    def k(name: str, dur: float, cat_: str) -> None:
        nonlocal t
        if dur <= 0:
            return
        out.append((name, "kernel", t, dur, cat_))
        t += dur + gap

    for _ in range(L):
        k(names["norm"], small, "norm")
        k(names["gemm"], gemm_layer * attn_share * 0.75, "gemm")
        k(names["rope"], small, "attention")
        k(attn_name, attn, "attention")
        k(names["gemm"], gemm_layer * attn_share * 0.25, "gemm")
        if comm:
            k(names["allreduce"], comm, "communication")
        k(names["norm"], small, "norm")
        if m.is_moe:
            k(names["moe_gate"], small, "moe")
            k(names["moe_align"], small, "moe")
            k(names["moe"], moe * 0.67, "moe")
            k(names["act"], small, "moe")
            k(names["moe"], moe * 0.33, "moe")
        if m.shared_ffn or not m.is_moe:
            k(names["gemm"], gemm_layer * (1 - attn_share) * 0.67, "gemm")
            k(names["act"], small, "gemm")
            k(names["gemm"], gemm_layer * (1 - attn_share) * 0.33, "gemm")
        if comm:
            k(names["allreduce"], comm, "communication")
    k(names["logits"], c.gemm_s * scale * lm_frac, "gemm")
    if c.draft_s:
        k(names["gemm"], c.draft_s * scale * 0.8, "speculative")
        k(names["decode_attn"], c.draft_s * scale * 0.2, "speculative")
    k(names["softmax"], c.sample_s * scale * 0.3, "sampling")
    k(names["sample"], c.sample_s * scale * 0.7, "sampling")
    out.append(("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", t, 3e-6, "memcpy"))
    return out


def build_trace(steps: list["Step"], core: "EngineCore", *, rank: int = 0) -> dict:
    """A PyTorch-profiler-shaped Chrome trace of the recorded steps (one rank's view)."""
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": HOST_TID, "args": {"name": "scheduler"}},
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"GPU {rank}"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": GPU_STREAM, "args": {"name": f"stream {GPU_STREAM}"}},
    ]
    corr = 1
    for st in steps:
        base_us = st.start_s * 1e6
        fwd = {"prefill": "forward_extend", "mixed": "forward_extend", "decode": "forward_decode"}.get(st.kind, st.kind)
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ModelRunner.{fwd}", "pid": HOST_PID, "tid": HOST_TID,
                   "ts": round(base_us, 3), "dur": round(st.duration_s * 1e6, 3),
                   "args": {"kind": st.kind, "replica": st.replica}})
        for name, cat, off, dur, category in st.kernels:
            ts = round(base_us + off * 1e6, 3)
            d = round(max(dur * 1e6, 0.5), 3)
            if cat == "user_annotation":
                ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": HOST_PID, "tid": HOST_TID,
                           "ts": ts, "dur": d, "args": {}})
                continue
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": GPU_STREAM, "ts": ts, "dur": d,
                       "args": {"device": rank, "stream": GPU_STREAM, "correlation": corr,
                                "emulator_category": category}})
            corr += 1
        launch = "cudaGraphLaunch" if st.kind == "decode" and st.cost is not None and not st.cost.launch_s else "cudaLaunchKernel"
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": HOST_PID, "tid": HOST_TID,
                   "ts": round(base_us + (st.cost.cpu_s if st.cost else 0) * 1e6, 3), "dur": 8.0,
                   "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": HOST_PID, "tid": HOST_TID,
                   "ts": round(base_us + 2.0, 3), "dur": 3.0, "args": {}})
    return {"schemaVersion": 1,
            "deviceProperties": [{"id": rank, "name": f"NVIDIA {core.hw.name}", "totalGlobalMem": int(core.hw.memory_bytes)}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": core.knobs["tp_size"]},
            "traceEvents": ev, "traceName": f"emulator-{core.model.name}", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 0}


def write_trace(obj: dict, path: str | Path, gz: bool = True) -> Path:
    """Write a trace atomically (gzip when ``gz``); returns the path."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    return atomic_write_bytes(path, gzip.compress(data, compresslevel=5) if gz else data)


def trace_filename(profile_id: str, rank: int = 0, *, gz: bool = True) -> str:
    """SGLang's per-rank file name: ``{profile_id}-TP-{rank}.trace.json[.gz]``."""
    return f"{profile_id}-TP-{rank}.trace.json" + (".gz" if gz else "")


def write_profile(core_trace: dict, output_dir: str | Path, profile_id: str, tp_size: int) -> list[str]:
    """One file per TP rank, as SGLang writes them (ranks run the same kernels in lockstep)."""
    paths = []
    for rank in range(tp_size):
        obj = core_trace if rank == 0 else _retarget(core_trace, rank)
        paths.append(str(write_trace(obj, Path(output_dir) / trace_filename(profile_id, rank))))
    return paths


def _retarget(trace: dict, rank: int) -> dict:
    ev = []
    for e in trace["traceEvents"]:
        if e.get("pid") == 0 and e.get("cat") != "user_annotation":
            e = {**e, "pid": rank}
            if "args" in e and "device" in e["args"]:
                e["args"] = {**e["args"], "device": rank}
        ev.append(e)
    return {**trace, "traceEvents": ev, "distributedInfo": {**trace["distributedInfo"], "rank": rank}}
