"""Owns the options shared by the `noise` and `experiment` commands: endpoint, pool, engine, measurement settings."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from autoresearch_dagster.spec import EndpointSpec, SpecError

SOURCE_FILE = "source.json"  # beside a CLI-built pool: the fingerprint of the logs it was built from


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
    p.add_argument("--quick", action="store_true",
                   help="reduced measurement (shorter steps, fewer requests per step, coarser resolution)")
    p.add_argument("--step-duration", type=float, help="seconds per load step (default 60; --quick 20)")
    p.add_argument("--min-completed", type=int, help="completed requests needed per step (default 100; --quick 40)")
    p.add_argument("--resolution", type=float, help="relative capacity resolution (default 0.05)")
    p.add_argument("--start-rps", type=float, help="first probed arrival rate (default 1.0)")
    p.add_argument("--hold-e2e-multiple", type=float,
                   help="hold each step at least this many mean E2E latencies of the passing steps so far "
                        "(methods.md asks for 10; default 0 = fixed --step-duration)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--estimator", choices=["interp", "search"], default="interp",
                   help="per-run capacity the statistics compare: 'interp' (default; the rate where the SLA ratio "
                        "crosses 1, interpolated between load steps) or 'search' (highest passing rate found)")


def capacity_settings(args: argparse.Namespace) -> Any:
    from autoresearch_dagster.measure.capacity import CapacitySettings

    s = CapacitySettings(step_duration_s=20.0, min_completed=40, warmup_s=3.0, resolution=0.05) if args.quick \
        else CapacitySettings()
    for attr, field in (("step_duration", "step_duration_s"), ("min_completed", "min_completed"),
                        ("resolution", "resolution"), ("start_rps", "start_rps"),
                        ("hold_e2e_multiple", "hold_e2e_multiple")):
        if getattr(args, attr) is not None:
            setattr(s, field, getattr(args, attr))
    return s


def log_fingerprint(logs: list[Path], fmt: str) -> dict[str, Any]:
    """What a pool built from ``logs`` depends on besides the redaction key: each file's path, size and
    mtime, the reader format and the pool schema version. Equal fingerprints => the same source records."""
    from autoresearch_dagster.pool.schema import SCHEMA_VERSION

    files = []
    for p in logs:
        st = p.stat()
        files.append({"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return {"logs": files, "format": fmt, "pool_schema_version": SCHEMA_VERSION}


def load_pool(endpoint: EndpointSpec, args: argparse.Namespace, pool_dir: Path) -> Any:
    """``--pool``, else the pool in ``pool_dir`` if it was built from the same logs, else a new build there.

    Without AUTORESEARCH_REDACTION_KEY each build redacts under a fresh random key, so two builds of the
    same logs differ (and so would their campaigns); reusing the earlier build keeps one campaign. With
    the key set, the build is rebuilt (it is deterministic under the key, and a pool made under another
    key must not stand in for it). Only the logs' fingerprint is stored, never anything derived from a key.
    """
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.pool.build import build_pool
    from autoresearch_dagster.pool.redact import KEY_ENV

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
    fingerprint = log_fingerprint(logs, endpoint.workload.format)
    stamp = pool_dir / SOURCE_FILE
    if not os.environ.get(KEY_ENV) and stamp.exists():
        try:
            if json.loads(stamp.read_text()) == fingerprint:
                pool = read_pool(pool_dir)
                print(f"reusing replay pool {pool_dir} (built from the same, unchanged logs)")
                return pool
        except (OSError, ValueError) as e:
            print(f"rebuilding replay pool {pool_dir}: the earlier build is unreadable ({type(e).__name__})")
    built = build_pool(logs, endpoint.name, pool_dir, fmt=endpoint.workload.format)
    write_json(stamp, fingerprint)  # after the build is in place: a build cut short is never reused
    print(f"built replay pool {pool_dir} from {len(logs)} log file(s)")
    return read_pool(built.pool_path)


def open_results(args: argparse.Namespace) -> Any:
    if args.no_lake:
        return None
    from autoresearch_dagster.results import open_lake

    return open_lake(args.lake)


def open_campaign(endpoint: EndpointSpec, args: argparse.Namespace) -> tuple[Path, Any, Any, Any, Any]:
    """What noise and experiment runs share: (out dir, pool, engine, results lake, campaign)."""
    from autoresearch_dagster.engines import make_engine
    from autoresearch_dagster.experiments.harness import start_campaign

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = open_results(args)
    pool = load_pool(endpoint, args, results.pool_dir(endpoint.name) if results is not None else out / "pool")
    engine = make_engine(endpoint, engine=args.engine)
    campaign = start_campaign(endpoint, pool, results=results, engine_name=getattr(engine, "name", None))
    return out, pool, engine, results, campaign


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True, default=str, allow_nan=True)
    os.replace(tmp, path)
