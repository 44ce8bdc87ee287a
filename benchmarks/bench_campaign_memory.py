"""Peak memory of a whole campaign: the CLI process and every worker it starts, sampled from /proc.

Runs ``autoresearch campaign run`` on an endpoint (the demo by default) with an experiment budget
(24 by default) in a temporary directory outside any git checkout, samples the resident set of the
process tree every ``--every`` seconds, and prints the tree's peak, the parent's own peak
(``ru_maxrss`` of the child), the experiments run, the wall time and whether the target
(peak below ``--limit-gb``) held. Linux only (reads /proc).

    python benchmarks/bench_campaign_memory.py [--endpoint examples/endpoints/demo.yaml] [--budget 24]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def children_of() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree_rss_bytes(root: int) -> tuple[int, int]:
    """(resident bytes of ``root`` and all its descendants, number of processes)."""
    kids, todo, total, n = children_of(), [root], 0, 0
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
            n += 1
        except (OSError, ValueError, IndexError):
            pass
        todo.extend(kids.get(pid, []))
    return total, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default=str(ROOT / "examples/endpoints/demo.yaml"))
    ap.add_argument("--budget", type=int, default=24, help="experiment budget of the campaign")
    ap.add_argument("--limit-gb", type=float, default=2.0, help="target: tree peak below this")
    ap.add_argument("--every", type=float, default=0.5, help="sampling period, s")
    ap.add_argument("--extra", default="", help="more campaign-run arguments, one string")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="campaign-mem-") as tmp:
        out = Path(tmp) / "campaign"
        cmd = [sys.executable, "-m", "autoresearch_dagster", "campaign", "run", "--endpoint",
               str(Path(a.endpoint).resolve()), "--out", str(out), "--budget-experiments", str(a.budget),
               "--memory", str(Path(tmp) / "memory"), *a.extra.split()]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.perf_counter()
        log_path = Path(tmp) / "campaign.log"
        with open(log_path, "w") as logf:
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=logf, stderr=subprocess.STDOUT, text=True)
        peak, peak_n, samples = 0, 0, 0
        while proc.poll() is None:
            rss, n = tree_rss_bytes(proc.pid)
            if rss > peak:
                peak, peak_n = rss, n
            samples += 1
            time.sleep(a.every)
        text = log_path.read_text()
        wall = time.perf_counter() - t0
        child_max_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # largest single process
        summary = {}
        if (out / "campaign.json").exists():
            summary = json.loads((out / "campaign.json").read_text())
    if proc.returncode != 0:
        print(text[-3000:])
        print(f"campaign exited {proc.returncode}")
        return 1
    n_exp = (summary.get("spent") or {}).get("experiments")
    print(f"endpoint {Path(a.endpoint).name}  budget {a.budget} experiments  wall {wall:.0f} s  samples {samples}")
    print(f"experiments run: {n_exp}  ended: {summary.get('ended_because')} gain {summary.get('gain')}")
    print(f"peak resident, whole process tree: {peak / 2**30:.2f} GiB ({peak_n} processes at the peak)")
    print(f"peak resident, largest single process: {child_max_mb / 1024:.2f} GiB")
    ok = peak < a.limit_gb * 2**30
    print(f"target: tree peak < {a.limit_gb:.1f} GiB: {'met' if ok else 'NOT met'}")
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())
