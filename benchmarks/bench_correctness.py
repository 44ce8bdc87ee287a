"""Measures the correctness gate on the tiny torch model: divergence, verdict and time per numerics variant.

Every candidate variant is served over HTTP and gated against the fp32 reference with the same
prompt set; the table shows what the gate measured (nothing here is asserted). ``--quick`` uses a
smaller prompt set.
"""
from __future__ import annotations

import argparse
import time

from autoresearch_dagster.correctness import gate, prompt_set
from autoresearch_dagster.tinymodel import VARIANTS, serve_tiny_model_in_thread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one prompt per bucket instead of three")
    ap.add_argument("--tolerance", default="near_lossless", choices=["strict", "near_lossless"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prompts = prompt_set(1 if args.quick else 3, long_chars=400 if args.quick else 600)
    print(f"prompt set {prompts.version} ({len(prompts)} prompts, hash {prompts.hash}); tolerance {args.tolerance}")
    print(f"{'candidate':26s} {'verdict':7s} {'top1':>7s} {'KL mean':>9s} {'KL p99':>9s} {'TV mean':>8s} "
          f"{'TV max':>7s} {'thresh':>7s} {'greedy':>6s} {'pos':>6s} {'secs':>5s}")
    ref = serve_tiny_model_in_thread("reference", args.seed)
    try:
        for name in VARIANTS:
            cand = serve_tiny_model_in_thread(name, args.seed)
            t0 = time.monotonic()
            try:
                r = gate(ref.base_url, cand.base_url, prompts, tolerance=args.tolerance, seed=args.seed)
            finally:
                cand.stop()
            print(f"{name:26s} {'PASS' if r.passed else 'FAIL':7s} {r.top1_agreement:7.4f} {r.kl_mean:9.2e} "
                  f"{r.kl_p99:9.2e} {r.tv_mean:8.4f} {r.tv_max:7.3f} {r.threshold:7.1e} {r.greedy_match:6.2f} "
                  f"{r.n_positions:6d} {time.monotonic() - t0:5.1f}")
    finally:
        ref.stop()


if __name__ == "__main__":
    main()
