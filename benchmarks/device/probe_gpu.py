"""Measure one accelerator (or this CPU) for the emulator's device catalog: GEMMs, attention, memory, launches.

What the emulator's cost model prices, measured with torch alone (no engine, no extra packages):

- bf16 and fp8 GEMMs at decode shapes (M = a decode batch, 1..256, against K x N weights of typical hidden
  sizes 4096 / 8192 / 14336: memory-bound, so their bytes per second matter) and prefill shapes (M = 512..8192
  tokens: compute-bound, their FLOP/s matter). fp8 runs through ``torch._scaled_mm`` (e4m3 inputs, per-tensor
  scales, bf16 out) on CUDA GPUs of compute capability 8.9 or newer; elsewhere it is skipped with the reason.
- attention through ``scaled_dot_product_attention``: decode (one query token per sequence over a KV context,
  bytes per second) and causal prefill (FLOP/s), contexts 512..32k on a GPU.
- memory: a copy of a tensor far larger than the last-level cache (bytes read + written per second) and a
  read-only reduction of it (the KV-read pattern: bytes read per second).
- launch overhead: a loop of one-element kernels (microseconds per launch), and on CUDA the same kernels
  replayed from a CUDA graph.

Timing: CUDA events around a batch of calls after warm-up, synchronised, on a GPU; ``time.perf_counter`` on the
CPU; each figure is the median of repeats. Decode GEMMs rotate over copies of the weights that together exceed
the GPU's L2, so weights stream from HBM as in a serving step rather than hit the cache.

Writes one JSON file: the device, torch version, a timestamp, every measurement (shape, dtype, seconds, derived
TFLOP/s or GB/s) and a summary that ``autoresearch emulator fit-device --probe FILE`` reads.

    python benchmarks/device/probe_gpu.py --out benchmarks/data/probe_h100.json        # on a GPU: < 8 minutes
    python benchmarks/device/probe_gpu.py --tiny --device cpu --out /tmp/probe.json      # seconds, anywhere
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

SCHEMA = "autoresearch-device-probe/1"

# (K, N) weight shapes: an 8B model's attention output (4096 x 4096) and MLP up / down (4096 x 14336,
# 14336 x 4096), and a 70B model's square projection (8192 x 8192)
FULL = {
    "weights": [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192)],
    "decode_m": [1, 8, 32, 64, 128, 256],
    "prefill_m": [512, 1024, 2048, 4096, 8192],
    "attn_heads": 32, "attn_head_dim": 128, "attn_decode_batch": 8,
    "attn_ctx": [512, 2048, 8192, 32768],
    "mem_bytes": 2 * 1024 ** 3, "launches": 2000, "graph_kernels": 200,
    "warmup": 5, "repeats": 9, "target_s": 0.02, "rotate_bytes": 512 * 1024 ** 2,
}
TINY = {
    "weights": [(256, 256), (256, 512)],
    "decode_m": [1, 16],
    "prefill_m": [64, 128],
    "attn_heads": 4, "attn_head_dim": 64, "attn_decode_batch": 2,
    "attn_ctx": [128, 256],
    "mem_bytes": 64 * 1024 ** 2, "launches": 200, "graph_kernels": 20,
    "warmup": 2, "repeats": 5, "target_s": 0.002, "rotate_bytes": 0,
}


class Timer:
    """Median seconds per call of ``fn``: a warm-up, then repeats of a batch of calls sized to ``target_s``."""

    def __init__(self, device: torch.device, *, warmup: int, repeats: int, target_s: float):
        self.cuda = device.type == "cuda"
        self.warmup, self.repeats, self.target_s = warmup, repeats, target_s

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _batch(self, fn: Callable[[], Any], n: int) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        self._sync()
        one = self._batch(fn, 1)
        n = max(1, min(200, int(self.target_s / max(one, 1e-7))))  # batch short kernels so timer resolution is moot
        return statistics.median(self._batch(fn, n) for _ in range(self.repeats))


class Probe:
    def __init__(self, device: torch.device, shapes: dict[str, Any], budget_s: float):
        self.device, self.s, self.budget_s = device, shapes, budget_s
        self.t0 = time.monotonic()
        self.timer = Timer(device, warmup=shapes["warmup"], repeats=shapes["repeats"], target_s=shapes["target_s"])
        self.measurements: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def over_budget(self, what: str) -> bool:
        if self.elapsed() > self.budget_s:
            self.skipped.append({"what": what, "reason": f"budget of {self.budget_s:.0f} s spent"})
            return True
        return False

    def time(self, what: str, fn: Callable[[], Any]) -> float | None:
        """Median seconds of ``fn``, or None with the reason recorded where the backend refuses it (an fp8 shape's
        alignment, memory): one refusal does not cost the other measurements."""
        try:
            return self.timer(fn)
        except RuntimeError as e:  # torch.OutOfMemoryError is one too
            self.skipped.append({"what": what, "reason": (str(e).splitlines() or [type(e).__name__])[0][:300]})
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    def record(self, **m: Any) -> None:
        self.measurements.append(m)
        print(json.dumps(m), file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ GEMMs
    def fp8_reason(self) -> str:
        """Why fp8 GEMMs cannot run here ("" when they can)."""
        if self.device.type != "cuda":
            return "fp8 GEMMs need fp8 tensor cores (a CUDA GPU of compute capability 8.9+); this is a CPU"
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            return f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
        cap = torch.cuda.get_device_capability(self.device)
        if cap < (8, 9):
            return f"compute capability {cap[0]}.{cap[1]} has no fp8 tensor cores (8.9+ needed)"
        return ""

    def _weights(self, k: int, n: int, dtype: torch.dtype, phase: str) -> list[torch.Tensor]:
        """Copies of a K x N weight (column-major, as ``_scaled_mm`` wants its second operand): enough of them
        that a decode loop over them streams from HBM rather than the L2."""
        per = k * n * torch.empty((), dtype=dtype).element_size()
        copies = 1 if phase == "prefill" else max(1, min(64, math.ceil(self.s["rotate_bytes"] / per)))
        w = torch.randn(n, k, device=self.device, dtype=torch.bfloat16)
        return [(w.to(dtype) if dtype != torch.bfloat16 else w.clone()).t() for _ in range(copies)]

    def gemms(self) -> None:
        fp8 = self.fp8_reason()
        if fp8:
            self.skipped.append({"what": "fp8 GEMMs", "reason": fp8})
        dtypes = [("bf16", torch.bfloat16)] + ([] if fp8 else [("fp8_e4m3", torch.float8_e4m3fn)])
        for label, dtype in dtypes:
            for phase, ms in (("decode", self.s["decode_m"]), ("prefill", self.s["prefill_m"])):
                for k, n in self.s["weights"]:
                    ws = self._weights(k, n, dtype, phase)
                    for m in ms:
                        if self.over_budget(f"{label} {phase} GEMM {m}x{k}x{n}"):
                            return
                        self._gemm(label, dtype, phase, m, k, n, ws)
                    del ws

    def _gemm(self, label: str, dtype: torch.dtype, phase: str, m: int, k: int, n: int,
              ws: list[torch.Tensor]) -> None:
        a = torch.randn(m, k, device=self.device, dtype=torch.bfloat16)
        i = [0]
        if dtype == torch.bfloat16:
            def step() -> None:
                i[0] = (i[0] + 1) % len(ws)
                torch.mm(a, ws[i[0]])
        else:
            a8 = a.to(dtype)
            one = torch.ones((), device=self.device, dtype=torch.float32)

            def step() -> None:
                i[0] = (i[0] + 1) % len(ws)
                torch._scaled_mm(a8, ws[i[0]], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        sec = self.time(f"{label} {phase} GEMM {m}x{k}x{n}", step)
        if sec is None:
            return
        el = torch.empty((), dtype=dtype).element_size()
        moved = k * n * el + m * k * el + m * n * 2  # weights + activations in, bf16 out
        self.record(kind="gemm", phase=phase, dtype=label, shape={"m": m, "k": k, "n": n}, seconds=sec,
                    tflops=2.0 * m * k * n / sec / 1e12, gbs=moved / sec / 1e9)

    # ------------------------------------------------------------------ attention
    def attention(self) -> None:
        h, d, b = self.s["attn_heads"], self.s["attn_head_dim"], self.s["attn_decode_batch"]
        for ctx in self.s["attn_ctx"]:
            if self.over_budget(f"attention at context {ctx}"):
                return
            q = torch.randn(b, h, 1, d, device=self.device, dtype=torch.bfloat16)
            kv = torch.randn(2, b, h, ctx, d, device=self.device, dtype=torch.bfloat16)
            sec = self.time(f"decode attention at context {ctx}", lambda: F.scaled_dot_product_attention(q, kv[0], kv[1]))
            kv_bytes = kv.numel() * kv.element_size()
            if sec is not None:
                self.record(kind="attention", phase="decode", dtype="bf16",
                            shape={"batch": b, "heads": h, "head_dim": d, "q_len": 1, "context": ctx}, seconds=sec,
                            tflops=4.0 * b * h * d * ctx / sec / 1e12, gbs=kv_bytes / sec / 1e9,
                            s_per_ctx_token=sec / (b * ctx))
            del q, kv
            qkv = torch.randn(3, 1, h, ctx, d, device=self.device, dtype=torch.bfloat16)
            sec = self.time(f"prefill attention at context {ctx}",
                            lambda: F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True))
            flops = 4.0 * h * d * ctx * ctx / 2  # QK^T and PV over the causal half
            if sec is not None:
                self.record(kind="attention", phase="prefill", dtype="bf16",
                            shape={"batch": 1, "heads": h, "head_dim": d, "q_len": ctx, "context": ctx}, seconds=sec,
                            tflops=flops / sec / 1e12, gbs=qkv.numel() * qkv.element_size() / sec / 1e9,
                            s_per_ctx_token=sec / ctx)
            del qkv

    # ------------------------------------------------------------------ memory
    def memory(self) -> None:
        if self.over_budget("memory bandwidth"):
            return
        nbytes = self.s["mem_bytes"]
        src = torch.ones(nbytes // 2, device=self.device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        sec = self.time("memory copy", lambda: dst.copy_(src))
        if sec is not None:
            self.record(kind="memory", op="copy", shape={"bytes": nbytes}, dtype="bf16", seconds=sec,
                        gbs=2.0 * nbytes / sec / 1e9)  # read + written
        del dst
        words = src.view(torch.float32)  # the same bytes; an fp32 sum is a plain streaming read on every backend
        sec = self.time("memory read", lambda: words.sum())
        if sec is not None:
            self.record(kind="memory", op="read", shape={"bytes": nbytes}, dtype="fp32", seconds=sec,
                        gbs=nbytes / sec / 1e9)

    # ------------------------------------------------------------------ launches
    def launches(self) -> None:
        if self.over_budget("launch overhead"):
            return
        x = torch.zeros(1, device=self.device)
        n = self.s["launches"]

        def loop() -> None:
            for _ in range(n):
                x.add_(1.0)
        sec = self.time("eager launches", loop)
        if sec is not None:
            self.record(kind="launch", mode="eager", shape={"launches": n}, dtype="fp32", seconds=sec,
                        us_per_launch=sec / n * 1e6)
        if self.device.type != "cuda":
            self.skipped.append({"what": "CUDA-graph launches", "reason": "no CUDA device"})
            return
        kernels = self.s["graph_kernels"]
        graph = torch.cuda.CUDAGraph()
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm the kernel before capture, off the default stream as capture wants
                for _ in range(3):
                    x.add_(1.0)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                for _ in range(kernels):
                    x.add_(1.0)
        except RuntimeError as e:
            self.skipped.append({"what": "CUDA-graph launches", "reason": (str(e).splitlines() or ["capture"])[0]})
            return
        sec = self.time("CUDA-graph launches", graph.replay)
        if sec is not None:
            self.record(kind="launch", mode="graph", shape={"launches": kernels}, dtype="fp32", seconds=sec,
                        us_per_launch=sec / kernels * 1e6)


def _best(ms: list[dict[str, Any]], key: str, **match: Any) -> float | None:
    vals = [m[key] for m in ms if all(m.get(k) == v for k, v in match.items()) and key in m]
    return max(vals) if vals else None


def _at_largest_context(ms: list[dict[str, Any]], phase: str, key: str) -> float | None:
    vals = [m for m in ms if m["kind"] == "attention" and m["phase"] == phase]
    return max(vals, key=lambda m: m["shape"]["context"])[key] if vals else None


def summarize(ms: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the fitter reads: best achieved rates (the shape search's maximum, as a maximum-achievable
    benchmark reports), launch costs, and attention per token of context at the largest context measured."""
    launch = [m for m in ms if m["kind"] == "launch"]
    by_mode = {m["mode"]: m["us_per_launch"] for m in launch}
    return {
        "bf16_tflops": _best(ms, "tflops", kind="gemm", dtype="bf16", phase="prefill"),
        "fp8_tflops": _best(ms, "tflops", kind="gemm", dtype="fp8_e4m3", phase="prefill"),
        "decode_gemm_bf16_gbs": _best(ms, "gbs", kind="gemm", dtype="bf16", phase="decode"),
        "memory_bw_gbs": _best(ms, "gbs", kind="memory", op="copy"),
        "read_bw_gbs": _best(ms, "gbs", kind="memory", op="read"),
        "launch_us": by_mode.get("eager"),
        "graph_launch_us": by_mode.get("graph"),
        "attn_decode_s_per_ctx_token": _at_largest_context(ms, "decode", "s_per_ctx_token"),
        "attn_decode_gbs": _best(ms, "gbs", kind="attention", phase="decode"),
        "attn_prefill_tflops": _best(ms, "tflops", kind="attention", phase="prefill"),
        "attn_prefill_s_per_ctx_token": _at_largest_context(ms, "prefill", "s_per_ctx_token"),
    }


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": torch.cuda.get_device_name(device),
                "capability": f"{p.major}.{p.minor}", "memory_gib": p.total_memory / 1024 ** 3,
                "multiprocessors": p.multi_processor_count, "cuda": torch.version.cuda}
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "platform": platform.platform(),
            "threads": torch.get_num_threads(), "cpus": os.cpu_count()}


def _finite(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return None if isinstance(v, float) and not math.isfinite(v) else v


def run(device: str, tiny: bool, budget_s: float) -> dict[str, Any]:
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    dev = torch.device(device)
    probe = Probe(dev, TINY if tiny else FULL, budget_s)
    torch.manual_seed(0)
    with torch.inference_mode():
        probe.gemms()
        probe.attention()
        probe.memory()
    probe.launches()  # outside inference mode: graph capture of in-place ops on a plain tensor
    return _finite({
        "schema": SCHEMA, "device": device_info(dev), "torch": torch.__version__,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tiny": tiny, "budget_s": budget_s, "elapsed_s": probe.elapsed(),
        "measurements": probe.measurements, "skipped": probe.skipped, "summary": summarize(probe.measurements),
    })


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where to measure (default: cuda when torch sees a GPU)")
    ap.add_argument("--tiny", action="store_true", help="small shapes: seconds on a CPU (tests, a smoke run)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting new measurements after this many seconds (default 420); the rest is "
                         "listed as skipped")
    ap.add_argument("--out", help="JSON file to write (default: print it)")
    args = ap.parse_args(argv)
    result = run(args.device, args.tiny, args.budget_s)
    text = json.dumps(result, indent=2, allow_nan=False) + "\n"
    if args.out:
        tmp = f"{args.out}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)
    else:
        sys.stdout.write(text)
    s = result["summary"]
    fmt = lambda v, unit, scale=1.0: "n/a" if v is None else f"{v * scale:.4g} {unit}"  # noqa: E731
    print(f"{result['device']['name']} ({result['device']['type']}), torch {result['torch']}, "
          f"{result['elapsed_s']:.1f} s: bf16 {fmt(s['bf16_tflops'], 'TFLOP/s')}, fp8 {fmt(s['fp8_tflops'], 'TFLOP/s')}, "
          f"copy {fmt(s['memory_bw_gbs'], 'GB/s')}, read {fmt(s['read_bw_gbs'], 'GB/s')}, "
          f"launch {fmt(s['launch_us'], 'us')}, attention decode "
          f"{fmt(s['attn_decode_s_per_ctx_token'], 'ns per token of context', 1e9)}"
          + "".join(f"\n  skipped {k['what']}: {k['reason']}" for k in result["skipped"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
