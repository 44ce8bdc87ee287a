"""Real-engine benchmark (a start): vLLM's CPU build serving the tiny Llama, measured per vLLM config.

For each config (the endpoint's own, then each ``--config KNOB=VALUE[,KNOB=VALUE]``) it starts vLLM
through the ``vllm`` engine (``examples/real_engine/tiny-vllm-cpu.yaml``: server on core 1, runner on
core 0), runs the capacity search (``measure.capacity.find_capacity``, the CLI's path) on the demo pool
adapted to the endpoint, and prints one row: start-up seconds, capacity at the endpoint's SLA, whether
the search is valid (and why not), TTFT/TPOT p99 at capacity, steps invalid on client send lag, and the
failures by class. The rows are the measured side of the emulator-vs-vLLM table; the emulator side
(a model card from the tiny Llama's config.json, a device spec for this CPU, calibration on the baseline
curve) is not built yet, so no emulator figure is printed. Without ``make real-engine`` it says so and exits 0.

    .venv/bin/python benchmarks/bench_real_engine.py --config max_num_seqs=8     # about 5 minutes per config
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoresearch_dagster.engines import make_engine  # noqa: E402
from autoresearch_dagster.engines.vllm import vllm_python  # noqa: E402
from autoresearch_dagster.measure.capacity import find_capacity  # noqa: E402
from autoresearch_dagster.measure.profiles import measurement_profile  # noqa: E402
from autoresearch_dagster.pool.adapt import AdaptedPool, limits_from_options  # noqa: E402
from autoresearch_dagster.pool.build import build_pool  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.spec import load_endpoint, validate_server_config  # noqa: E402

SPEC = ROOT / "examples" / "real_engine" / "tiny-vllm-cpu.yaml"


def parse_config(text: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        out[k.strip()] = json.loads(v) if v.strip() not in ("", "None") else None
    return validate_server_config(out, "vllm")


def measure(spec, config: dict, pool, settings, seed: int) -> dict:
    t0 = time.monotonic()
    dep = make_engine(spec).deploy(config, seed=seed)
    startup = time.monotonic() - t0
    try:
        res = find_capacity(dep, pool, spec.sla, gpus=spec.gpus, model=dep.served_model(), settings=settings, seed=seed)
    finally:
        dep.close()
    at = [st for st in res.steps if st.passed and abs(st.rate_rps - res.capacity_rps) < 1e-9]
    failures: dict[str, int] = {}
    for o in res.outcomes:
        for cls, f in (o.meta.get("failures") or {}).items():
            failures[cls] = failures.get(cls, 0) + f["count"]
    return {"config": config, "startup_s": startup, "capacity_rps": res.capacity_rps, "valid": res.valid,
            "invalid_reasons": res.invalid_reasons, "ttft_p99_ms": at[-1].ttft_ms["p99"] if at else None,
            "tpot_p99_ms": at[-1].tpot_ms["p99"] if at else None, "steps": len(res.steps),
            "lag_invalid_steps": sum(1 for st in res.steps if any("send lag" in r for r in st.invalid_reasons)),
            "failures": failures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="a vLLM config beside the endpoint's: K=V[,K=V]")
    ap.add_argument("--step-duration", type=float, default=20.0)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    if vllm_python() is None or not (ROOT / ".real-engine" / "tiny-llama" / "config.json").exists():
        print("bench_real_engine: skipped, the real engine is not built (make real-engine)")
        return 0
    spec = load_endpoint(SPEC)
    configs = [dict(spec.server_config)] + [{**spec.server_config, **parse_config(c)} for c in args.config]
    with tempfile.TemporaryDirectory() as tmp:
        build_pool(spec.log_paths(), spec.name, Path(tmp) / "pool",
                   tokenizer_path=str(ROOT / ".real-engine" / "tiny-llama" / "tokenizer.json"))  # the model's counts
        pool = AdaptedPool(read_pool(Path(tmp) / "pool"), limits_from_options(spec))
        print(pool.summary())
        settings = measurement_profile("standard").with_overrides(
            step_duration_s=args.step_duration, min_completed=15, start_rps=0.5, max_steps=args.max_steps,
            warmup_s=5.0, request_timeout_s=60.0).capacity
        rows = []
        for cfg in configs:
            rows.append(measure(spec, cfg, pool, settings, args.seed))
            r = rows[-1]
            print(f"{json.dumps(r['config']):60s} start {r['startup_s']:5.0f} s  capacity {r['capacity_rps']:.3g} req/s  "
                  f"{'valid' if r['valid'] else 'INVALID'}  ttft p99 {r['ttft_p99_ms'] or float('nan'):.0f} ms  "
                  f"tpot p99 {r['tpot_p99_ms'] or float('nan'):.0f} ms  lag-invalid steps {r['lag_invalid_steps']}/"
                  f"{r['steps']}  failures {r['failures'] or 'none'}", flush=True)
    print(f"SLA {spec.sla}; emulator column: not built yet (no CPU device spec, no vLLM-to-emulator knob mapping)")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
