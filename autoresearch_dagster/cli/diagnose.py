"""Owns `autoresearch diagnose`: measure an endpoint, explain where and why it breaks, rank hypotheses.

Writes DIR/report.md (with PNG plots beside it) and DIR/report.json, and prints the top
hypotheses. Without --pool, the replay pool is built from the endpoint spec's logs into DIR/pool.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autoresearch_dagster.measure.profiles import PROFILES
from autoresearch_dagster.spec import SpecError, load_endpoint


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("diagnose", help="diagnose an endpoint: workload, load curve, metrics, profile, probes",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", required=True, help="endpoint spec YAML")
    p.add_argument("--pool", help="replay pool directory or parquet (default: build one from the spec's logs)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--measure", choices=sorted(PROFILES), default="standard",
                   help="measurement profile (measure/profiles.py): standard (default); short: short load steps "
                        "and only the quick probes; quick: make run's steady-state steps and the quick probes")
    p.add_argument("--no-probes", action="store_true", help="skip the diagnostic probes")
    p.add_argument("--no-profile", action="store_true", help="skip profiling the diagnostic step")
    p.add_argument("--probes-dir", action="append", default=[], help="extra folder of probe recipes (repeatable)")
    p.add_argument("--memory", default="memory/probes.jsonl",
                   help="JSONL file recording which probes were useful (default memory/probes.jsonl; '' to skip)")
    p.add_argument("--engine", help="engine override (default: the spec's)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from autoresearch_dagster.diagnose import diagnose, top_hypotheses_text
    from autoresearch_dagster.engines import make_engine
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.pool.build import build_pool

    spec = load_endpoint(args.endpoint)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.pool:
        try:
            pool = read_pool(args.pool)
        except FileNotFoundError as e:
            raise SpecError(str(e)) from None
    else:
        logs = spec.log_paths()
        if not logs:
            raise SpecError(f"endpoint {spec.name!r} lists no workload.logs; pass --pool")
        built = build_pool(logs, spec.name, out / "pool", fmt=spec.workload.format)
        pool = read_pool(built.pool_path)
        print(f"built replay pool {built.pool_path} ({len(pool)} requests)")
    engine = make_engine(spec, engine=args.engine)
    report = diagnose(spec, pool, engine=engine, config=dict(spec.server_config), out_dir=out, measurement=args.measure,
                      probes=not args.no_probes, profile=not args.no_profile,
                      probe_dirs=[Path(d) for d in args.probes_dir],
                      memory_path=Path(args.memory) if args.memory else None, seed=args.seed,
                      progress=lambda msg: print(f"  {msg}", flush=True))
    md, js = report.write(out)
    print(f"wrote {md} and {js}")
    print(top_hypotheses_text(report))
    return 0
