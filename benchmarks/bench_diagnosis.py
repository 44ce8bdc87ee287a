"""Diagnosis validation table: each emulator scenario with a known bottleneck, the rank the report gave it.

Prints one row per scenario (true bottleneck, its rank, the top-3 hypotheses with scores, wall
time) and the tally against the target (first in at least 7 of 8, top two in all).
Flags: --measure PROFILE (default standard; short: short load steps, quick probes only), --no-probes,
--scenarios a,b,c, --out DIR.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoresearch_dagster.diagnose.scenarios import SCENARIOS, run_scenario, scenario  # noqa: E402
from autoresearch_dagster.measure.profiles import PROFILES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", choices=sorted(PROFILES), default="standard",
                    help="measurement profile (short: short load steps and only the quick probes)")
    ap.add_argument("--no-probes", action="store_true")
    ap.add_argument("--scenarios", help="comma-separated subset (default: all)")
    ap.add_argument("--out", help="keep the reports here (default: a temporary directory)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    names = args.scenarios.split(",") if args.scenarios else [s.name for s in SCENARIOS]
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_diagnosis_"))
    load = os.getloadavg()[0]
    print(f"diagnosis validation: {len(names)} scenarios, measurement profile {args.measure}, "
          f"probes {'off' if args.no_probes else 'on'}, emulator in virtual time; load average {load:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'scenario':26s} {'true bottleneck':26s} {'rank':>4s}  top-3 hypotheses (score){'':28s} {'wall':>6s}")
    t0 = time.perf_counter()
    ranks = []
    for n in names:
        r = run_scenario(scenario(n), out / n, measurement=args.measure, probes=not args.no_probes, seed=args.seed)
        r.report.write(out / n / "report")
        ranks.append(r.rank)
        top = ", ".join(f"{b} ({s:.2f})" for b, s in r.top)
        print(f"{r.name:26s} {r.truth:26s} {str(r.rank):>4s}  {top:75s} {r.wall_s:5.0f}s", flush=True)
    first = sum(1 for r in ranks if r == 1)
    top2 = sum(1 for r in ranks if r is not None and r <= 2)
    need_first = max(len(ranks) - 1, int(round(len(ranks) * 7 / 8)))
    ok = first >= need_first and top2 == len(ranks)
    print(f"ranked first: {first}/{len(ranks)} (target >= {need_first}); in the top two: {top2}/{len(ranks)} "
          f"(target {len(ranks)}); {'PASS' if ok else 'MISS'}; total {time.perf_counter() - t0:.0f}s; reports in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
