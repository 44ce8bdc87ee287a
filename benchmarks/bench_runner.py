"""Runner speed benchmark: how high an offered rate each client paces exactly, side by side with SGLang's.

Setup: ``benchmarks/stream_server.py`` (raw asyncio, 64 one-token SSE chunks per response, logging each
request's arrival on CLOCK_MONOTONIC) pinned to one core; the client pinned to another. For this
runner and for ``sglang.benchmark.serving`` (from ``.venv-sglang``; ``scripts/sglang_venv.sh``) it walks
a ladder of Poisson rates and reports, per rate: requests sent/arrived, the achieved arrival rate
against the client's own intended schedule over the window (this runner: its recorded send offsets;
SGLang: the gaps its generator drew, recorded by benchmarks/sglang_client.py), the p99 lateness of
arrivals, and (this runner) the p99 send lag and the client core's busy fraction. A rate passes when
every request arrived, the achieved rate is within 1% of the intended one, and (this runner) p99 send
lag <= 2 ms. Then an agreement check at a moderate rate with a slower server (TTFT ~20 ms, 2 ms
between chunks): median TTFT and TPOT of both clients.

    .venv/bin/python benchmarks/bench_runner.py            # full (~3 min)
    .venv/bin/python benchmarks/bench_runner.py --quick    # reduced ladder
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings  # noqa: E402
from autoresearch_dagster.loadgen.schedule import build_schedule, poisson_offsets  # noqa: E402
from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool  # noqa: E402

SGLANG_PY = ROOT / ".venv-sglang" / "bin" / "python"
CLIENT_CORE, SERVER_CORE = 0, 1
# The 2-core machine is shared with other work: both sides of the benchmark run at raised priority
# (where permitted) so that other processes' time slices do not show up as client send lag; with --rt
# both clients and the server run SCHED_FIFO (real-time, priority 10) instead.
NICE = -10
RT = False


def _prio_prefix() -> list[str]:
    return ["chrt", "-f", "10"] if RT else ["nice", "-n", str(NICE)]


class StreamServer:
    def __init__(self, *, ttft_ms: float, gap_ms: float) -> None:
        self.proc = subprocess.Popen([*_prio_prefix(), sys.executable, str(ROOT / "benchmarks" / "stream_server.py"), "--core",
                                      str(SERVER_CORE), "--ttft-ms", str(ttft_ms), "--gap-ms", str(gap_ms)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"stream server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def arrivals(self) -> list[tuple[float, str]]:
        with urllib.request.urlopen(self.url + "/_arrivals", timeout=30) as r:
            return [tuple(x) for x in json.loads(r.read())]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _cpu_busy_sample() -> tuple[float, float]:
    with open("/proc/stat") as f:
        vals = [float(x) for x in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def _machine_busy(a, b) -> float:
    return (b[0] - a[0]) / max(b[1] - a[1], 1e-9)


def _pool(tmp: Path):
    rows = [PoolRequest(id=f"b{i}", arrival_s=float(i), conversation_id=None, turn=None, api="chat",
                        messages=[{"role": "user", "content": f"benchmark prompt number {i}"}], prompt=None, tools=None,
                        tool_choice=None, response_format=None, sampling={"temperature": 0.0}, prompt_tokens=8,
                        output_tokens=64, block_hashes=[], block_tokens=64, split="serving") for i in range(64)]
    return read_pool(write_pool(rows, tmp / "pool"))


def run_ours(server: StreamServer, pool, rate: float, n: int, seed: int) -> dict:
    offsets = poisson_offsets(rate, n / rate, seed=seed)
    sched = build_schedule(pool, offsets, model="bench-model", seed=seed)
    server.arrivals()  # clear
    dep = HttpDeployment(server.url, admin=False, settings=RunnerSettings(scrape_metrics_s=None))
    m0 = _cpu_busy_sample()
    out = dep.run_step(sched, step_id=f"bench-{rate}", timeout_s=30.0)
    m1 = _cpu_busy_sample()
    arr = {rid: t for t, rid in server.arrivals()}
    t0 = out.meta["t0_monotonic"]
    got = [(arr[s.request_id], s.send_offset_s) for s in sched if s.request_id in arr]
    res = {"client": "this runner", "rate": rate, "n": len(sched), "arrived": len(got),
           "ok": sum(r.status == "ok" for r in out.records),
           "send_lag_p99_ms": out.meta["send_lag_p99_ms"], "client_busy": max(out.meta["client_cpu_busy"]),
           "machine_busy": _machine_busy(m0, m1), "invalid": out.client_invalid_reasons, "records": out.records}
    if len(got) > 1:
        a = np.sort([g[0] for g in got])
        intended_span = sched[-1].send_offset_s - sched[0].send_offset_s
        res["rate_err"] = intended_span / (a[-1] - a[0]) - 1.0
        res["arrival_late_p99_ms"] = float(np.percentile([t - t0 - off for t, off in got], 99)) * 1e3
    res["passed"] = (res["arrived"] == res["n"] and abs(res.get("rate_err", 1)) <= 0.01
                     and res["send_lag_p99_ms"] <= 2.0)
    return res


def run_sglang(server: StreamServer, tok_dir: Path, rate: float, n: int, seed: int, tmp: Path) -> dict:
    gaps_file, out_file = tmp / f"gaps-{rate}.json", tmp / f"sg-{rate}.jsonl"
    out_file.unlink(missing_ok=True)
    server.arrivals()
    env = {**os.environ, "SGLANG_GAPS_OUT": str(gaps_file), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [str(SGLANG_PY), str(ROOT / "benchmarks" / "sglang_client.py"), "--backend", "sglang-oai-chat",
           "--base-url", server.url, "--model", "bench-model", "--tokenizer", str(tok_dir),
           "--dataset-name", "random-ids", "--random-input-len", "16", "--random-output-len", "64",
           "--random-range-ratio", "1.0", "--num-prompts", str(n), "--request-rate", str(rate),
           "--warmup-requests", "0", "--seed", str(seed), "--output-file", str(out_file),
           "--extra-request-body", '{"stream_options":{"include_usage":true}}']
    m0 = _cpu_busy_sample()
    proc = subprocess.run([*_prio_prefix(), *cmd], env=env, capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: os.sched_setaffinity(0, {CLIENT_CORE}))
    m1 = _cpu_busy_sample()
    if proc.returncode != 0:
        raise RuntimeError(f"sglang.benchmark.serving failed: {proc.stderr[-2000:]}")
    arrivals = sorted(t for t, _ in server.arrivals())
    gaps = json.loads(gaps_file.read_text())
    summary = json.loads(out_file.read_text().splitlines()[-1])
    res = {"client": "sglang.bench_serving", "rate": rate, "n": n, "arrived": len(arrivals),
           "ok": summary.get("completed"), "machine_busy": _machine_busy(m0, m1), "summary": summary}
    if len(arrivals) > 1:
        intended = np.concatenate([[0.0], np.cumsum(gaps[:len(arrivals) - 1])])
        res["rate_err"] = intended[-1] / (arrivals[-1] - arrivals[0]) - 1.0
        res["arrival_late_p99_ms"] = float(np.percentile(np.asarray(arrivals) - arrivals[0] - intended, 99)) * 1e3
    res["passed"] = res["arrived"] == n and abs(res.get("rate_err", 1)) <= 0.01
    return res


def _row(r: dict) -> str:
    lag = f"{r['send_lag_p99_ms']:7.2f}" if "send_lag_p99_ms" in r else "      -"
    busy = f"{r['client_busy'] * 100:5.0f}%" if "client_busy" in r else "     -"
    return (f"{r['client']:22s} {r['rate']:8.0f} {r['n']:6d} {r['arrived']:7d} {r.get('rate_err', float('nan')) * 100:+8.2f}% "
            f"{r.get('arrival_late_p99_ms', float('nan')):10.2f} {lag} {busy} {r['machine_busy'] * 100:6.0f}%  "
            f"{'PASS' if r['passed'] else 'fail'}")


def ladder(name: str, rates: list[float], run) -> tuple[float, list[dict]]:
    print(f"\n{'client':22s} {'rate':>8s} {'n':>6s} {'arrived':>7s} {'rate err':>9s} {'late p99ms':>10s} "
          f"{'lag p99':>7s} {'busy':>6s} {'machine':>7s}")
    best, rows = 0.0, []
    for rate in rates:
        r = run(rate)
        rows.append(r)
        print(_row(r), flush=True)
        if not r["passed"]:
            break
        best = rate
    return best, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="reduced ladders and windows")
    ap.add_argument("--window-s", type=float, default=4.0, help="seconds of schedule per rate (ours)")
    ap.add_argument("--skip-sglang", action="store_true")
    ap.add_argument("--rt", action="store_true",
                    help="run clients and server SCHED_FIFO (root): on a machine loaded by other work, "
                         "measures the clients rather than the scheduler's time slices")
    args = ap.parse_args()
    global RT
    RT = args.rt
    ours_rates = [250, 500, 1000, 1500] if args.quick else [250, 500, 1000, 1250, 1500, 1750, 2000, 2500]
    sg_rates = [10, 50, 200] if args.quick else [10, 25, 50, 100, 200, 400]
    have_sglang = SGLANG_PY.exists() and not args.skip_sglang
    os.sched_setaffinity(0, {CLIENT_CORE})
    try:
        if RT:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        else:
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except PermissionError:
        print("note: could not raise the client's priority; send lag includes other processes' time slices")
    load0 = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average before {load0[0]:.2f} {load0[1]:.2f}; "
          f"client on core {CLIENT_CORE}, server on core {SERVER_CORE}; "
          f"{'SCHED_FIFO (--rt)' if RT else f'nice {NICE}'}")
    tmp = Path(tempfile.mkdtemp(prefix="bench_runner_"))
    pool = _pool(tmp)
    t_start = time.time()
    server = StreamServer(ttft_ms=5, gap_ms=0)
    try:
        run_ours(server, pool, 50, 50, seed=99)  # connection and import warm-up, not reported
        best_ours, _ = ladder("ours", ours_rates,
                              lambda r: run_ours(server, pool, r, max(400, int(r * args.window_s)), seed=int(r)))
        best_sg = None
        if have_sglang:
            tok = tmp / "tokenizer"
            subprocess.run([str(SGLANG_PY), str(ROOT / "benchmarks" / "sglang_client.py"), "--make-tokenizer", str(tok)],
                           check=True, capture_output=True)
            best_sg, _ = ladder("sglang", sg_rates,
                                lambda r: run_sglang(server, tok, r, max(100, min(int(r * 4), 1200)), int(r), tmp))
    finally:
        server.stop()

    agree = None
    server = StreamServer(ttft_ms=20, gap_ms=2)
    try:
        rate, n = 20.0, 200
        ours = run_ours(server, pool, rate, n, seed=7)
        ok = [r for r in ours["records"] if r.status == "ok"]
        ours_ttft = float(np.median([r.ttft_s for r in ok])) * 1e3
        ours_tpot = float(np.median([r.tpot_s for r in ok])) * 1e3
        agree = {"ours": (ours_ttft, ours_tpot)}
        if have_sglang:
            sg = run_sglang(server, tmp / "tokenizer", rate, n, 7, tmp)
            agree["sglang"] = (sg["summary"]["median_ttft_ms"], sg["summary"]["median_tpot_ms"])
    finally:
        server.stop()

    load1 = os.getloadavg()
    print("\n=== side by side ===")
    print(f"highest offered rate paced exactly (all arrive, rate within 1% of intended, ours: p99 send lag <= 2 ms):")
    print(f"  this runner (1 client core):          {best_ours:8.0f} req/s")
    print(f"  sglang.bench_serving (1 client core): {best_sg if best_sg is not None else 'not run':>8} req/s"
          + ("" if have_sglang else "  (skipped)" if args.skip_sglang else
             "  (.venv-sglang missing: run scripts/sglang_venv.sh)"))
    print(f"agreement at {rate:.0f} req/s, server TTFT ~20 ms and 2 ms between chunks (median TTFT / TPOT, ms):")
    print(f"  this runner:          {agree['ours'][0]:7.2f} / {agree['ours'][1]:6.3f}")
    if "sglang" in agree:
        sg_ttft, sg_tpot = agree["sglang"]
        print(f"  sglang.bench_serving: {sg_ttft:7.2f} / {sg_tpot:6.3f}   (differences: TTFT "
              f"{(agree['ours'][0] / sg_ttft - 1) * 100:+.1f}%, TPOT {(agree['ours'][1] / sg_tpot - 1) * 100:+.1f}%; "
              f"{'within' if abs(agree['ours'][0] / sg_ttft - 1) <= 0.05 and abs(agree['ours'][1] / sg_tpot - 1) <= 0.05 else 'NOT within'} 5%)")
    print(f"machine load average after: {load1[0]:.2f} {load1[1]:.2f} (2 cores shared with other work); "
          f"benchmark took {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
