"""Measure this CPU's bf16 matmul FLOP/s and memory bandwidth for the emulator's CPU device spec (issue 14).

A short torch microbenchmark on the threads torch is given (default: all cores): the best of a few timed
bf16 GEMMs (n x n @ n x n, 2 n^3 FLOP each; on Sapphire Rapids oneDNN uses AMX tiles) and the best of a
few copies of a tensor far larger than the L2 (bytes read + bytes written per copy). The figures it prints
are the ones ``autoresearch_dagster.emulator.catalog`` records for "cpu-spr-2c".

    .venv/bin/python benchmarks/bench_cpu_peak.py [--n 2048] [--mib 1024] [--reps 5]
"""
from __future__ import annotations

import argparse
import time

import torch


def best_seconds(fn, reps: int) -> float:
    fn()  # warm-up (oneDNN kernel selection, page faults)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    a = torch.randn(args.n, args.n, dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, dtype=torch.bfloat16)
    t = best_seconds(lambda: torch.mm(a, b), args.reps)
    flops = 2 * args.n ** 3 / t
    src = torch.empty(args.mib * 2 ** 20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    tc = best_seconds(lambda: dst.copy_(src), args.reps)
    bw = 2 * src.numel() / tc
    print(f"threads={torch.get_num_threads()} bf16 matmul n={args.n}: {flops / 1e12:.3f} TFLOP/s "
          f"(best of {args.reps}: {t * 1e3:.1f} ms)")
    print(f"memory copy {args.mib} MiB: {bw / 1e9:.2f} GB/s read+write (best of {args.reps}: {tc * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
