"""Demo headroom: the emulator's exhaustive grid on the demo endpoint; default vs best capacity.

The ground truth the campaign benchmarks measure against: capacity (req/s at the demo SLA) of
SGLang's default config and of every grid point, measured with the runner's capacity search on
the virtual-time emulator. The issue requires best >= 1.4 x default.

Usage: python benchmarks/bench_demo_headroom.py [--grid reduced|quick|full] [--step-s 60] [--workers 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from autoresearch_dagster.experiments.grid import (DEFAULT_GRID, QUICK_GRID, GridSettings, ensure_pool, grid_size, knob_grid,
                                                   run_grid, write_grid)
from autoresearch_dagster.spec import load_endpoint

REDUCED_GRID = knob_grid(("prefill_decode_interval", "enable_mixed_chunk", "quantization"), quick=True)
GRIDS = {"full": DEFAULT_GRID, "quick": QUICK_GRID, "reduced": REDUCED_GRID}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint", default=str(Path(__file__).resolve().parents[1] / "examples/endpoints/demo.yaml"))
    ap.add_argument("--grid", choices=sorted(GRIDS), default="reduced",
                    help=f"reduced: {grid_size(REDUCED_GRID)} points (~1.5 min); quick: {grid_size(QUICK_GRID)} points "
                         f"(~5 min on 2 loaded cores); full: {grid_size(DEFAULT_GRID)} points")
    ap.add_argument("--step-s", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="directory for grid.json (default: a temporary directory)")
    args = ap.parse_args()
    ep = load_endpoint(args.endpoint)
    out = Path(args.out or tempfile.mkdtemp(prefix="demo-grid-"))
    print(f"load average before: {os.getloadavg()}")
    t0 = time.perf_counter()
    pool = ensure_pool(ep, out)
    print(f"pool built from {ep.workload.logs} in {time.perf_counter() - t0:.1f} s: {pool}")
    grid = GRIDS[args.grid]
    res = run_grid(ep, pool, grid=grid, settings=GridSettings(step_duration_s=args.step_s, workers=args.workers))
    path = write_grid(res, out)
    n = len(res.points)
    print(f"grid '{args.grid}': {n} points ({', '.join(grid)}), SLA {res.sla}, {res.wall_s:.0f} s wall")
    print(f"default  {res.default['capacity_rps']:7.2f} req/s  (limited by {res.default['limited_by']})")
    print(f"best     {res.best['capacity_rps']:7.2f} req/s  {res.best['config']}")
    print(f"lossless {res.best_lossless['capacity_rps']:7.2f} req/s  {res.best_lossless['config']}")
    print(f"best / default = {res.ratio:.2f}x   lossless best / default = "
          f"{res.best_lossless['capacity_rps'] / res.default['capacity_rps']:.2f}x   (required >= 1.40x)")
    print(f"load average after: {os.getloadavg()}; grid.json: {path}")


if __name__ == "__main__":
    main()
