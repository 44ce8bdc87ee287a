"""Profile parsing on a trace written the way SGLang's profiler writes it, and on CPU-only traces."""
from __future__ import annotations

import gzip
import json

import pytest

from autoresearch_dagster.diagnose.profile import (ProfileError, classify_kernel, parse_profile,
                                                   parse_trace_filename)
from .helpers import (DECODE_KERNELS, N_DECODE_AFTER, N_DECODE_BEFORE, PREFILL_KERNELS,
                                     gpu_events)


@pytest.mark.parametrize("name,cat", [
    ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("BatchPrefillWithPagedKVCacheKernel<...>", "attention"),
    ("BatchDecodeWithPagedKVCacheKernel<...>", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "gemm_moe"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "gemm_moe"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "gemm_moe"),
    ("fused_moe_kernel", "gemm_moe"),
    ("void topkGatingSoftmax<8, 128>", "gemm_moe"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("cross_device_reduce_2stage<float, 8>", "communication"),
    ("top_k_top_p_sampling_from_probs", "sampling"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "sampling"),
    ("Memcpy HtoD (Pageable -> Device)", "memory"),
    ("Memset (Device)", "memory"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "other_gpu"),
    ("rms_norm_kernel", "other_gpu"),
])
def test_kernel_names_classify(name, cat):
    assert classify_kernel(name) == cat


def test_sglang_file_names():
    f = parse_trace_filename("run7-1790857026.1234-TP-3-DP-1-EP-3.trace.json.gz")
    assert f["prefix"] == "run7" and f["profile_id"] == "1790857026.1234" and f["tp"] == 3 and f["dp"] == 1 and f["ep"] == 3
    f = parse_trace_filename("my-prefix-1790857026.5-TP-0-DECODE.trace.json.gz")
    assert f["prefix"] == "my-prefix" and f["stage"] == "DECODE" and f["tp"] == 0
    assert parse_trace_filename("random.json") is None


def test_sglang_profile_directory(sglang_trace_dir):
    d, expect = sglang_trace_dir
    s = parse_profile(d)
    assert len(s.files) == 2 and all(f.endswith(".trace.json.gz") for f in s.files)
    assert [r.rank.get("tp") for r in s.ranks] == [0, 1]
    assert s.has_gpu
    # The breakdown adds the two ranks' kernel time per category.
    n_dec = N_DECODE_BEFORE + N_DECODE_AFTER
    moe = 2 * n_dec * (300.0 + 400.0) + 2 * 3000.0
    attn = 2 * (n_dec * 100.0 + 2000.0)
    comm = 2 * (n_dec * 50.0 + 100.0)
    assert s.breakdown_us["gemm_moe"] == pytest.approx(moe)
    assert s.breakdown_us["attention"] == pytest.approx(attn)
    assert s.breakdown_us["communication"] == pytest.approx(comm)
    assert s.breakdown_us["sampling"] == pytest.approx(2 * n_dec * 20.0)
    assert s.breakdown_us["memory"] == pytest.approx(2 * (n_dec + 1) * 8.0)
    idle = expect["window_us"] - expect["busy_us"]
    assert s.breakdown_us["cpu_scheduling"] == pytest.approx(2 * idle)
    assert s.gpu_idle_fraction == pytest.approx(idle / expect["window_us"])
    assert sum(s.breakdown_share.values()) == pytest.approx(1.0)
    # Gap histogram: per rank, 1us + 10us gaps inside steps and the 400us gaps between steps.
    assert sum(s.gap_hist) == 2 * len(expect["gaps"])
    assert s.gap_hist[s.gap_bins_us.index(200.0)] == 2 * (N_DECODE_BEFORE + N_DECODE_AFTER)
    # The timeline: one prefill between decodes on each rank, several times longer than a decode step.
    assert s.n_steps["prefill"] == 2 and s.n_steps["decode"] == 2 * n_dec
    assert s.prefill_interrupts_decode and s.prefill_interruptions == 2
    assert s.decode_stall_ratio == pytest.approx(dict(expect["steps"])["prefill"] / dict(expect["steps"])["decode"])
    assert s.decode_stall_ratio > 4
    assert 0.0 <= s.cpu_gpu_overlap <= 1.0
    d2 = s.to_dict()
    json.dumps(d2)


def test_unannotated_kernels_split_into_steps_at_long_gaps():
    events, expect = gpu_events(1000.0)
    bare = [e for e in events if e["cat"] != "gpu_user_annotation"]
    s = parse_profile({"traceEvents": bare})
    assert s.n_steps["prefill"] == 1 and s.n_steps["decode"] == N_DECODE_BEFORE + N_DECODE_AFTER
    assert s.prefill_interruptions == 1
    # Only decode steps, no prefill: nothing interrupts.
    only_decode = [e for e in bare if e["name"] not in {k for k, _ in PREFILL_KERNELS}]
    assert not parse_profile(only_decode).prefill_interrupts_decode


def test_launch_gaps_raise_idle_share():
    tight, _ = gpu_events(0.0)
    s_tight = parse_profile(tight)
    loose = []
    t = 0.0
    for _ in range(50):
        for name, dur in DECODE_KERNELS:
            loose.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur / 10, "pid": 0, "tid": 7,
                          "args": {"stream": 7, "correlation": 1, "device": 0}})
            t += dur / 10 + 40.0  # small kernels with 40us launch gaps: a CPU-bound decode
    s_loose = parse_profile(loose)
    assert s_loose.gpu_idle_fraction > 0.3 > s_tight.gpu_idle_fraction
    assert s_loose.launch_gap_share > s_tight.launch_gap_share


def test_cpu_only_torch_trace_breakdown(sglang_trace_dir, tmp_path):
    d, _ = sglang_trace_dir
    obj = json.loads(gzip.decompress(next(d.glob("*TP-0*")).read_bytes()))
    cpu_only = {**obj, "traceEvents": [e for e in obj["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_user_annotation")]}
    path = tmp_path / "cpu-1-TP-0.trace.json"
    path.write_text(json.dumps(cpu_only))
    s = parse_profile(path)
    assert not s.has_gpu and s.gpu_idle_fraction is None
    assert s.breakdown_us["gemm_moe"] > 0 and s.breakdown_us["sampling"] > 0  # aten::linear, softmax/topk
    assert s.n_steps["prefill"] == 1 and s.n_steps["decode"] == 3
    assert any(n.startswith("aten::linear") for n, _, _ in s.top_kernels)


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        parse_profile(tmp_path / "missing.trace.json.gz")
    bad = tmp_path / "x-1-TP-0.trace.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ProfileError, match="not readable"):
        parse_profile(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match="no"):
        parse_profile(tmp_path / "empty")
    with pytest.raises(ProfileError, match="traceEvents"):
        parse_profile({"foo": 1})
