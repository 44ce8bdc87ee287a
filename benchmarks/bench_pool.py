"""Benchmarks the replay-pool build: token-trace records/s, chat requests/s with redaction, one-hour trace pool size.

Prints measured figures (targets from issue 2: >= 50,000 trace records/s through parse + pool write;
>= 2,000 chat requests/s of ~2 KB each with redaction on 2 cores; a one-hour trace averaging 12k
prompt tokens gives a pool of tens of MB). Usage: python benchmarks/bench_pool.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.pool.build import build_pool  # noqa: E402

WORDS = ("the service should keep latency low while batch grows and each request waits in queue before "
         "scheduler admits it into next step of engine we measured throughput across several runs").split()


def dir_mb(d: Path) -> float:
    return sum(f.stat().st_size for f in d.iterdir()) / 1e6


def make_azure(path: Path, n: int, rng: random.Random) -> None:
    t = datetime(2023, 11, 16, 18, 0, 0, tzinfo=timezone.utc)
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for _ in range(n):
            t += timedelta(microseconds=int(rng.expovariate(1 / 20000)))
            f.write(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')},{rng.randint(10, 8000)},{rng.randint(1, 900)}\n")


def make_mooncake(path: Path, n: int, rate: float, mean_tokens: int, rng: random.Random, reuse: float = 0.5) -> None:
    """Mooncake-style trace: hash_ids of 512-token blocks; a fraction of requests extend an earlier prefix."""
    t, next_id, recent = 0.0, 0, []
    with open(path, "w") as f:
        for _ in range(n):
            t += rng.expovariate(rate) * 1000
            n_blocks = max(1, int(rng.expovariate(1 / (mean_tokens / 512))) + 1)
            ids: list[int] = []
            if recent and rng.random() < 0.7:
                base = rng.choice(recent)
                ids = base[: max(1, min(len(base), int(n_blocks * reuse * 2 * rng.random())))]
            while len(ids) < n_blocks:
                ids.append(next_id)
                next_id += 1
            recent.append(ids)
            if len(recent) > 200:
                recent.pop(0)
            length = (len(ids) - 1) * 512 + rng.randint(1, 512)
            f.write(json.dumps({"timestamp": int(t), "input_length": length, "output_length": rng.randint(5, 900),
                                "hash_ids": ids}, separators=(",", ":")) + "\n")


def make_chat(path: Path, n: int, rng: random.Random) -> None:
    """Chat logs of ~2 KB of message text each, a quarter with planted PII."""
    system = "You are a helpful support assistant. " + " ".join(rng.choice(WORDS) for _ in range(60))
    t = 1772442000.0
    with open(path, "w") as f:
        for i in range(n):
            t += rng.expovariate(20.0)
            text = " ".join(rng.choice(WORDS) for _ in range(300))
            if i % 4 == 0:
                text += f" My name is Mary Smith, mail mary.smith{i % 97}@example.com or call 212-555-{i % 10000:04d}."
            rec = {"timestamp": t, "request_id": f"r{i}", "request": {
                "model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
                "temperature": 0.7, "max_tokens": 256}, "response": {"usage": {"prompt_tokens": 500, "completion_tokens": 120}}}
            f.write(json.dumps(rec) + "\n")


def timed_build(path: Path, out: Path, **kw) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds of this process and its finished worker processes, summary)."""
    c0 = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    t0 = time.perf_counter()
    res = build_pool([path], "bench", out, key=b"bench-key", **kw)
    wall = time.perf_counter() - t0
    cpu = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - c0
    return wall, cpu, res.summary


def peak_rss_mb(path: Path, out: Path) -> float:
    """Peak resident memory of a separate process building a pool from ``path`` (as it reports it)."""
    code = ("import resource, sys; from autoresearch_dagster.pool.build import build_pool; "
            "build_pool([sys.argv[1]], 'bench', sys.argv[2], key=b'k', workers=1); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    res = subprocess.run([sys.executable, "-c", code, str(path), str(out)], check=True, capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])
    return int(res.stdout.split()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller inputs (about a tenth)")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    rng = random.Random(11)
    tmp = Path(tempfile.mkdtemp(prefix="bench_pool_"))
    try:
        print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f} at start")
        n = int(300_000 * scale)
        make_azure(tmp / "azure.csv", n, rng)
        wall, cpu, s = timed_build(tmp / "azure.csv", tmp / "p_azure")
        print(f"token trace (Azure CSV, no prefix blocks): {n} records in {wall:.2f} s = {n / wall:,.0f} records/s "
              f"({n / cpu:,.0f} per CPU-second; parse + pool write; target >= 50,000/s)")
        n = int(100_000 * scale)
        make_mooncake(tmp / "mc.jsonl", n, rate=30.0, mean_tokens=4000, rng=rng)
        wall, cpu, s = timed_build(tmp / "mc.jsonl", tmp / "p_mc")
        blocks = read_pool(tmp / "p_mc").meta["blocks"]
        print(f"token trace (Mooncake JSONL, {blocks / n:.1f} new 512-token blocks per record, block table written): "
              f"{n} records in {wall:.2f} s = {n / wall:,.0f} records/s ({n / cpu:,.0f} per CPU-second)")

        n = int(20_000 * scale)
        make_chat(tmp / "chat.jsonl", n, rng)
        size_kb = (tmp / "chat.jsonl").stat().st_size / n / 1e3
        for workers in (1, 2):
            wall, cpu, s = timed_build(tmp / "chat.jsonl", tmp / f"p_chat{workers}", workers=workers)
            print(f"chat logs with redaction (~{size_kb:.1f} KB/request, {workers} worker process"
                  f"{'es' * (workers > 1)}): {n} requests in {wall:.2f} s = {n / wall:,.0f} requests/s, "
                  f"{n / cpu:,.0f} per CPU-second (target >= 2,000/s on 2 cores); redactions {s['redactions']}; "
                  f"prompt-token change {100 * s['prompt_token_change']:+.3f}%")

        hour_n = int(3 * 3600 * scale)  # 3 requests/s for an hour
        make_mooncake(tmp / "hour.jsonl", hour_n, rate=3.0, mean_tokens=12000, rng=rng)
        wall, cpu, s = timed_build(tmp / "hour.jsonl", tmp / "p_hour")
        mean_in = s["prompt_tokens_pool"] / s["rows_accepted"]
        pool = read_pool(tmp / "p_hour")
        t0 = time.perf_counter()
        sample = [pool.request(i) for i in range(0, len(pool), max(1, len(pool) // 200))]
        per_req_ms = (time.perf_counter() - t0) / len(sample) * 1e3
        print(f"one-hour trace ({'quick: a tenth of ' if args.quick else ''}3 req/s, {hour_n} requests, mean prompt "
              f"{mean_in:,.0f} tokens, {pool.meta['blocks']} distinct blocks): pool {dir_mb(tmp / 'p_hour'):.1f} MB on disk "
              f"(replay_pool.parquet {(tmp / 'p_hour' / 'replay_pool.parquet').stat().st_size / 1e6:.1f} MB, "
              f"blocks.parquet {(tmp / 'p_hour' / 'blocks.parquet').stat().st_size / 1e6:.1f} MB); "
              f"trace file {(tmp / 'hour.jsonl').stat().st_size / 1e6:.1f} MB; built in {wall:.1f} s; "
              f"assembling a prompt at replay {per_req_ms:.1f} ms")

        for n in (int(300_000 * scale), int(1_500_000 * scale)):
            make_azure(tmp / f"big{n}.csv", n, rng)
            mb = (tmp / f"big{n}.csv").stat().st_size / 1e6
            print(f"bounded memory: building from a {mb:.0f} MB trace ({n} records) peaks at "
                  f"{peak_rss_mb(tmp / f'big{n}.csv', tmp / f'p_big{n}'):.0f} MB resident (libraries included)")
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
