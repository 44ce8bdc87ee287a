"""Helpers for diagnosis tests: profiles written the way SGLang's profiler writes them."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

# One decode step = these kernels back to back with KERNEL_GAP_US between them.
DECODE_KERNELS = [
    ("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTT", 300.0),
    ("BatchDecodeWithPagedKVCacheKernel<...>", 100.0),
    ("fused_moe_kernel", 400.0),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 50.0),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<...>", 20.0),
]
PREFILL_KERNELS = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 3000.0),
    ("BatchPrefillWithPagedKVCacheKernel<...>", 2000.0),
    ("cross_device_reduce_1stage<__nv_bfloat16, 2>", 100.0),
]
KERNEL_GAP_US = 10.0
STEP_GAP_US = 400.0
N_DECODE_BEFORE, N_DECODE_AFTER = 8, 8


def gpu_events(t0: float, pid: int = 0) -> tuple[list[dict], dict]:
    """Kernel, memcpy and GPU-annotation events in PyTorch's CUDA trace schema, and the expected figures."""
    events: list[dict] = []
    t = t0
    corr = 1000
    expect = {"kernel_us": {}, "busy_us": 0.0, "gaps": [], "steps": []}

    def step(kind: str, kernels: list[tuple[str, float]]) -> None:
        nonlocal t, corr
        start = t
        for i, (name, dur) in enumerate(kernels):
            corr += 1
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": pid, "tid": 7, "ts": t, "dur": dur,
                           "args": {"queued": 0, "device": pid, "context": 1, "stream": 7, "correlation": corr,
                                    "registers per thread": 128, "shared memory": 0, "grid": [132, 1, 1],
                                    "block": [128, 1, 1], "est. achieved occupancy %": 12}})
            expect["kernel_us"][name] = expect["kernel_us"].get(name, 0.0) + dur
            expect["busy_us"] += dur
            t += dur
            if i < len(kernels) - 1:
                t += KERNEL_GAP_US
                expect["gaps"].append(KERNEL_GAP_US)
        corr += 1
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": pid, "tid": 8,
                       "ts": t + 1.0, "dur": 8.0, "args": {"device": pid, "context": 1, "stream": 8,
                                                           "correlation": corr, "bytes": 4096, "memory bandwidth (GB/s)": 0.5}})
        expect["kernel_us"]["memcpy"] = expect["kernel_us"].get("memcpy", 0.0) + 8.0
        expect["busy_us"] += 8.0
        expect["gaps"] += [1.0]
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"{kind}_forward", "pid": pid, "tid": 7,
                       "ts": start, "dur": t + 9.0 - start, "args": {"External id": corr}})
        expect["steps"].append((kind, t + 9.0 - start))
        t += 9.0 + STEP_GAP_US
        expect["gaps"].append(STEP_GAP_US)

    for _ in range(N_DECODE_BEFORE):
        step("decode", DECODE_KERNELS)
    step("prefill", PREFILL_KERNELS)
    for _ in range(N_DECODE_AFTER):
        step("decode", DECODE_KERNELS)
    expect["gaps"].pop()  # no gap after the last step
    expect["window_us"] = t - STEP_GAP_US - t0
    return events, expect


def _torch_cpu_trace(path: Path) -> dict:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(8, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(4):
            with record_function("prefill" if i == 0 else "decode"):
                logits = model(x)
                torch.topk(torch.softmax(logits, -1), 5)
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def sglang_trace_dir(tmp_path_factory) -> tuple[Path, dict]:
    """Two ranks written as SGLang names them: {prefix-}{profile_id}-TP-{tp}.trace.json.gz.

    Each holds a real torch.profiler CPU trace with GPU kernel events (PyTorch's CUDA schema) added.
    """
    d = tmp_path_factory.mktemp("profiles")
    base = _torch_cpu_trace(d / "raw.json")
    (d / "raw.json").unlink()
    cpu_events = base["traceEvents"]
    t0 = min(e["ts"] for e in cpu_events if e.get("ph") == "X")
    expect = None
    for tp in (0, 1):
        gpu, expect = gpu_events(t0, pid=tp)
        obj = {**base, "deviceProperties": [{"id": tp, "name": "NVIDIA H200", "totalGlobalMem": 150754820096}],
               "traceEvents": cpu_events + gpu}
        with gzip.open(d / f"diag-1790857026.1234-TP-{tp}.trace.json.gz", "wt") as f:
            json.dump(obj, f)
    return d, expect
