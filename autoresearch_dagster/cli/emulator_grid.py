"""Owns `autoresearch emulator grid`: the exhaustive knob-grid search of an endpoint in the emulator.

Registered by ``cli/emulator.py`` (which also holds ``serve``) through ``register_grid(sub)``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from autoresearch_dagster.experiments.grid import (DEFAULT_GRID, QUICK_GRID, GridSettings, ensure_pool, grid_size, run_grid,
                                                   write_grid)
from autoresearch_dagster.spec import SpecError, load_endpoint


def register_grid(sub: Any) -> None:
    sp = sub.add_parser(
        "grid", help="exhaustive search over a documented knob grid in the emulator; writes DIR/grid.json",
        description="Measure, in the virtual-time emulator, the capacity at the endpoint's SLA of its own server "
                    f"config and of every point of the grid ({', '.join(DEFAULT_GRID)}, each at its search values "
                    "in spec.KNOBS), with the runner's capacity search. "
                    "Writes DIR/grid.json {default, best, best_lossless, points}.")
    sp.add_argument("--endpoint", required=True, help="endpoint spec YAML")
    sp.add_argument("--out", required=True, help="output directory (grid.json; pool/ when built from the logs)")
    sp.add_argument("--pool", help="replay pool (parquet or its directory); default: build one from the endpoint's logs")
    sp.add_argument("--quick", action="store_true", help=f"the reduced grid ({grid_size(QUICK_GRID)} points) "
                                                          f"instead of the full one ({grid_size(DEFAULT_GRID)})")
    sp.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    sp.add_argument("--step-s", type=float, default=60.0, help="seconds per load step of each capacity search")
    sp.add_argument("--seed", type=int, default=0, help="seed shared by every point (common random numbers)")
    sp.set_defaults(func=_grid)


def _grid(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise SpecError(f"--workers must be >= 1, got {args.workers}")
    if args.step_s <= 0:
        raise SpecError(f"--step-s must be positive, got {args.step_s}")
    endpoint = load_endpoint(args.endpoint)
    if endpoint.engine != "emulator":
        print(f"note: endpoint {endpoint.name!r} names engine {endpoint.engine!r}; the grid runs in the emulator",
              file=sys.stderr)
    pool_path = ensure_pool(endpoint, args.out, args.pool)
    grid = QUICK_GRID if args.quick else DEFAULT_GRID

    def progress(point: dict, i: int, n: int) -> None:
        cfg = ", ".join(f"{k}={v}" for k, v in point["config"].items()) or "(default)"
        print(f"[{i}/{n}] {point['capacity_rps']:.2f} req/s  {cfg}", file=sys.stderr, flush=True)

    res = run_grid(endpoint, pool_path, grid=grid,
                   settings=GridSettings(step_duration_s=args.step_s, seed=args.seed, workers=args.workers),
                   progress=progress)
    path = write_grid(res, args.out)
    print(f"default {res.default['capacity_rps']:.2f} req/s; best {res.best['capacity_rps']:.2f} req/s "
          f"({res.ratio:.2f}x) with {res.best['config']}; best lossless {res.best_lossless['capacity_rps']:.2f} req/s "
          f"with {res.best_lossless['config']}")
    print(path)
    return 0
