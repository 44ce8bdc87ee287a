"""Benchmark: the emulator's real-time HTTP server under many concurrent streams.

Serves an endpoint (default: llama-3.1-8b on one H200, whose decode steps are a few ms, so every
stream gets hundreds of tokens/s) with ``serve_in_thread`` and drives it with the runner's
``HttpDeployment`` (which runs its client in its own process). All streams start within a short
ramp and generate a pinned number of tokens. Prints: streamed tokens/s (total and per stream),
the server process's CPU use, CPU microseconds per streamed chunk, and how far the client-side
TPOT is from the engine-clock TPOT (the fidelity cost of the HTTP path at that load).

    .venv/bin/python benchmarks/bench_emulator_http.py                 # 100 streams x 400 tokens
    .venv/bin/python benchmarks/bench_emulator_http.py --streams 20 --tokens 100   # reduced
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.server import EmulatorServer, serve_in_thread
from autoresearch_dagster.loadgen.http_runner import HttpDeployment
from autoresearch_dagster.loadgen.records import ScheduledRequest
from autoresearch_dagster.spec import EndpointSpec
from autoresearch_dagster.tokens import block_hashes, count_tokens, render_prompt, synth_text


def schedule(streams: int, tokens: int, ramp_s: float) -> list[ScheduledRequest]:
    out = []
    for i in range(streams):
        msgs = [{"role": "user", "content": synth_text(200, i)}]
        text = render_prompt(msgs)
        body = {"model": "m", "messages": msgs, "max_tokens": tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        out.append(ScheduledRequest(f"b{i}", ramp_s * i / streams, "chat", body, count_tokens(text), tokens,
                                    block_hashes(text, 64), 64))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--stream-interval", type=int, default=1)
    ap.add_argument("--ramp", type=float, default=1.0, help="seconds over which the streams start")
    args = ap.parse_args()

    endpoint = EndpointSpec(name="bench", model=args.model, hardware={"gpu": args.gpu, "count": 1},
                            sla="ttft_p99<=5000ms")
    server = EmulatorServer(endpoint, {"stream_interval": args.stream_interval}, noise=NoiseSettings.off())
    sched = schedule(args.streams, args.tokens, args.ramp)
    with serve_in_thread(server) as running:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        out = HttpDeployment(running.base_url).run_step(sched, step_id="bench", timeout_s=300)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        driver = server.driver
        resyncs, steps = driver.late_resyncs, driver.steps
    ok = [r for r in out.records if r.status == "ok"]
    chunks = sum(len(r.itl_s) + 1 for r in ok)
    tokens = sum(r.output_tokens for r in ok)
    active = max(r.end_s for r in ok) - min(r.sent_s for r in ok)
    served = {s.rid: s for s in server.request_log}
    c_tpot = np.array([r.tpot_s for r in ok])
    e_tpot = np.array([served[r.request_id].tpot_s for r in ok])
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    print(f"streams ok: {len(ok)}/{len(out.records)}   client invalid reasons: {out.client_invalid_reasons or 'none'}")
    print(f"streamed: {tokens} tokens in {chunks} chunks over {active:.2f} s = {tokens / active:,.0f} tokens/s "
          f"total; per stream while decoding: {1 / np.median(c_tpot):,.0f} tokens/s (1 / median client TPOT)")
    print(f"server process CPU: {cpu:.2f} s over {wall:.2f} s wall = {cpu / wall:.0%} of one core; "
          f"{cpu / max(1, chunks) * 1e6:.1f} us CPU per streamed chunk")
    print(f"engine steps: {steps}, late re-syncs (loop > 50 ms behind): {resyncs}")
    print(f"TPOT p50: engine clock {np.median(e_tpot) * 1e3:.2f} ms, client {np.median(c_tpot) * 1e3:.2f} ms "
          f"({np.median(c_tpot) / np.median(e_tpot) - 1:+.1%}); p99: engine {np.percentile(e_tpot, 99) * 1e3:.2f} ms, "
          f"client {np.percentile(c_tpot, 99) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
