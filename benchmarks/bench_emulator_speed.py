"""Emulator speed: generated tokens simulated per CPU-second, and one hour of production-shaped
traffic at 10 req/s (~36k requests) simulated in virtual time (target: < 10 s wall).

Usage: python benchmarks/bench_emulator_speed.py [--hours 1.0] [--rate 10] [--reduced]
Prints the figures; asserts nothing. Report the machine load alongside (os.getloadavg is printed).
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from autoresearch_dagster.emulator.catalog import gpu, model_card
from autoresearch_dagster.emulator.core import EmuRequest, EngineCore
from autoresearch_dagster.emulator.sim import simulate
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.loadgen.records import ScheduledRequest
from autoresearch_dagster.spec import EndpointSpec


def production_arrivals(rate: float, hours: float, seed: int) -> np.ndarray:
    """Diurnal-ish modulated Poisson: +-30% slow wave, 5-minute bursts at 2x, mean ``rate``."""
    rng = np.random.default_rng(seed)
    dur = hours * 3600.0
    peak = rate * 2.6
    t, out = 0.0, []
    while t < dur:
        t += rng.exponential(1.0 / peak)
        lam = rate * (1 + 0.3 * math.sin(2 * math.pi * t / 1800.0)) * (2.0 if (t // 300) % 6 == 5 else 0.85)
        if rng.random() < lam / peak:
            out.append(t)
    return np.array(out)


def chat_requests(arrivals: np.ndarray, seed: int, prefix: str = "p") -> list[EmuRequest]:
    """Chat-like lengths (demo-log-shaped): ~1.3k-token prompts with 5 shared system prompts, bimodal outputs."""
    rng = np.random.default_rng(seed)
    n = len(arrivals)
    prompts = np.clip(np.round(900 * np.exp(rng.normal(0, 0.7, n))), 64, 16000).astype(int)
    long_out = rng.random(n) < 0.3
    outputs = np.where(long_out, rng.integers(300, 1400, n), rng.integers(12, 120, n))
    system = rng.integers(0, 5, n)
    out = []
    for i in range(n):
        shared = [hash(("sys", int(system[i]), b)) for b in range(6)]
        own = [hash((prefix, i, b)) for b in range(6, prompts[i] // 64)]
        out.append(EmuRequest(f"{prefix}{i}", int(prompts[i]), int(outputs[i]), (shared + own)[: prompts[i] // 64],
                              64, float(arrivals[i])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--reduced", action="store_true", help="a 10-minute run instead of an hour")
    args = ap.parse_args()
    hours = 10 / 60 if args.reduced else args.hours
    model, hw = model_card("gemma-moe-26b-a4b"), gpu("H200")
    print(f"load average before: {os.getloadavg()}")

    # 1) throughput of the simulator on a saturated decode-heavy batch
    reqs = chat_requests(np.sort(np.random.default_rng(1).uniform(0, 60, 3000)), seed=1, prefix="s")
    cpu0 = time.process_time()
    res = simulate(EngineCore(model, hw, 1, {}, seed=0), reqs)
    cpu = time.process_time() - cpu0
    print(f"saturated: {res.generated_tokens} tokens generated in {cpu:.2f} CPU-s "
          f"-> {res.generated_tokens / cpu:,.0f} tokens per CPU-second")

    # 2) production-shaped hour at 10 req/s, through the engine's run_step (records included)
    arr = production_arrivals(args.rate, hours, seed=2)
    reqs = chat_requests(arr, seed=2)
    sched = [ScheduledRequest(r.rid, r.arrival_s, "chat", {}, r.prompt_tokens, r.output_tokens, r.block_hashes, 64)
             for r in reqs]
    ep = EndpointSpec(name="bench", model=model.name, hardware={"gpu": hw.name, "count": 1},
                      sla="ttft_p99<=3000ms,tpot_p99<=60ms")
    dep = EmulatorEngine(ep).deploy({}, seed=0)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out = dep.run_step(sched, step_id="hour", timeout_s=600)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    toks = sum(r.output_tokens for r in out.records)
    ok = sum(r.status == "ok" for r in out.records)
    print(f"production shape: {len(sched)} requests over {hours * 60:.0f} virtual minutes "
          f"(mean {len(sched) / (hours * 3600):.2f} req/s), {ok} ok, {toks:,} tokens: "
          f"{wall:.2f} s wall, {cpu:.2f} CPU-s -> {toks / cpu:,.0f} tokens per CPU-second "
          f"(target: < 10 s wall for 1 h at 10 req/s)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
