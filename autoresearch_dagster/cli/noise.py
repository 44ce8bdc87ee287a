"""Owns `autoresearch noise`: repeated independent baseline runs -> the endpoint's noise floor (noise.json)."""
from __future__ import annotations

import argparse

from autoresearch_dagster.cli._experiments_common import add_measure_args, capacity_settings, open_campaign
from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.spec import load_endpoint


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("noise", help="measure the noise floor: capacity spread over repeated baseline runs",
                       description="Runs N independent baseline runs (fresh deployment, distinct seeds) and writes "
                                   "OUT/noise.json: capacity CV, median with a bootstrap CI, and the spread of key "
                                   "latency quantiles at a reference rate (0.8 x the first capacity).")
    add_measure_args(p)
    p.add_argument("--runs", type=int, default=5, help="independent baseline runs (>= 5; default 5)")
    p.add_argument("--reference-rps", type=float, help="rate for the latency spread (default 0.8 x first capacity)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from autoresearch_dagster.experiments.noise import measure_noise
    from autoresearch_dagster.experiments.runs import HarnessSettings
    from autoresearch_dagster.spec import SpecError

    if args.runs < 5:
        raise SpecError(f"--runs must be at least 5 for a noise floor, got {args.runs}")
    endpoint = load_endpoint(args.endpoint)
    out, pool, engine, results, campaign = open_campaign(endpoint, args)
    res = measure_noise(endpoint, endpoint.server_config, pool, engine=engine, runs=args.runs, results=results,
                        settings=HarnessSettings(capacity=capacity_settings(args), seed=args.seed,
                                                 estimator=args.estimator),
                        reference_rps=args.reference_rps, campaign=campaign, progress=print)
    write_json(out / "noise.json", res.to_dict())
    f = res.floor
    print(f"noise floor for {endpoint.name} ({res.engine} {res.engine_version}): capacity CV {f.cv:.2%} over "
          f"{f.n} runs; median {f.median:.4g} req/s, {f.confidence:.0%} CI [{f.ci_low:.4g}, {f.ci_high:.4g}] "
          f"({f.ci_method}; {res.estimator} capacity per run)")
    for name, s in res.latency_spread.items():
        print(f"  {name} at {res.reference_rps:.3g} req/s: median {s['median']:.1f} ms, CV {s['cv']:.1%}")
    print(f"wrote {out / 'noise.json'}")
    return 0
