"""Owns the options shared by the `noise` and `experiment` commands: endpoint, pool, engine, measurement settings."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autoresearch_dagster.measure.profiles import PROFILES, measurement_profile
from autoresearch_dagster.spec import EndpointSpec, SpecError

def add_measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", required=True, help="endpoint spec (YAML/JSON)")
    p.add_argument("--pool", help="replay pool (directory or parquet); default: built from the endpoint's logs "
                                  "into LAKE/_pools/ENDPOINT (OUT/pool with --no-lake), reused while the logs are "
                                  "unchanged")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--engine", choices=["emulator", "sglang", "modal", "external"],
                   help="override the endpoint's engine")
    p.add_argument("--lake", default="out/lake", help="results lake root (Parquet + analytics.duckdb); default out/lake")
    p.add_argument("--no-lake", action="store_true", help="do not record runs in the results lake")
    p.add_argument("--measure", choices=sorted(PROFILES), default="standard",
                   help="measurement profile (measure/profiles.py; default standard); the flags below override it")
    p.add_argument("--step-duration", type=float, help="seconds per load step (standard 60; short 40)")
    p.add_argument("--min-completed", type=int, help="completed requests needed per step (standard 100; short 25)")
    p.add_argument("--resolution", type=float, help="relative capacity resolution (standard 0.05; short 0.15)")
    p.add_argument("--start-rps", type=float, help="first probed arrival rate (default 1.0)")
    p.add_argument("--hold-e2e-multiple", type=float,
                   help="hold each step at least this many mean E2E latencies of the passing steps so far "
                        "(methods.md asks for 10; default 0 = fixed --step-duration)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--estimator", choices=["interp", "search"], default="interp",
                   help="per-run capacity the statistics compare: 'interp' (default; the rate where the SLA ratio "
                        "crosses 1, interpolated between load steps) or 'search' (highest passing rate found)")


def capacity_settings(args: argparse.Namespace) -> Any:
    """The ``--measure`` profile's capacity settings with the explicit flags over it."""
    return measurement_profile(args.measure).with_overrides(
        step_duration_s=args.step_duration, min_completed=args.min_completed, resolution=args.resolution,
        start_rps=args.start_rps, hold_e2e_multiple=args.hold_e2e_multiple).capacity


def load_pool(endpoint: EndpointSpec, args: argparse.Namespace, pool_dir: Path) -> Any:
    """``--pool``, else the pool built from the endpoint's logs in ``pool_dir``, reused while they are
    unchanged (``pool.sources.ensure_pool``)."""
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.pool.sources import ensure_pool, log_files

    if args.pool:
        if not Path(args.pool).exists():
            raise SpecError(f"--pool {args.pool} does not exist")
        return read_pool(args.pool)
    logs = endpoint.log_paths()
    if not logs:
        raise SpecError(f"endpoint {endpoint.name!r} names no logs (workload.logs); pass --pool")
    missing = [str(p) for p in logs if not p.exists()]
    if missing:
        raise SpecError(f"endpoint {endpoint.name!r}: log files not found: {', '.join(missing)}")
    return ensure_pool(log_files(logs), endpoint.name, pool_dir, fmt=endpoint.workload.format).pool


def open_results(args: argparse.Namespace) -> Any:
    if args.no_lake:
        return None
    from autoresearch_dagster.results import open_lake

    return open_lake(args.lake)


def open_campaign(endpoint: EndpointSpec, args: argparse.Namespace) -> tuple[Path, Any, Any, Any, Any]:
    """What noise and experiment runs share: (out dir, pool, engine, results lake, campaign)."""
    from autoresearch_dagster.engines import make_engine
    from autoresearch_dagster.experiments.campaign import start_campaign

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = open_results(args)
    pool = load_pool(endpoint, args, results.pool_dir(endpoint.name) if results is not None else out / "pool")
    engine = make_engine(endpoint, engine=args.engine)
    campaign = start_campaign(endpoint, pool, results=results, engine_name=getattr(engine, "name", None))
    return out, pool, engine, results, campaign

