"""Owns `autoresearch emulator calibrate` and `autoresearch emulator errors`: grounding the emulator in measurements.

``calibrate`` fits the emulator's efficiency factors to a measured baseline load curve
(``emulator.measured`` reads it, ``emulator.calibrate`` fits it), prints the fitted factors and the
residual of every point and metric, and stores the calibration with the endpoint as its next version
(``emulator.calibrations``). ``errors`` prints the endpoint's emulator error report: how far the
calibrated emulator's predicted capacity ratios were from the verified experiments' measured ones, by
knob family and over time, and whether the error is drifting (``agents.emulator_errors``).
Registered by ``cli/emulator.py`` through ``register_calibrate(sub)``.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from autoresearch_dagster.spec import SpecError, load_endpoint, load_server_config


def register_calibrate(sub: Any) -> None:
    sp = sub.add_parser(
        "calibrate", help="fit the emulator's efficiency factors to a measured load curve; store it with the endpoint",
        description="Fit the emulator's efficiency factors (bounded least squares over the log-ratios of emulated to "
                    "measured latency percentiles) to a measured baseline load curve: the --out directory of "
                    "`autoresearch replay capacity` (summary.json) or `autoresearch noise` (noise.json). Only steps "
                    "that met the SLA well below the knee are fitted. Prints the factors and each point's residuals, "
                    "and stores LAKE/_calibrations/ENDPOINT/vN.json plus a row in the lake's `calibrations` table; "
                    "the campaign's surrogate then starts from the latest version, and an emulator endpoint with "
                    "engine_options: {calibration: latest} runs on it.")
    sp.add_argument("--endpoint", required=True, help="endpoint spec YAML (model, hardware, SLA)")
    sp.add_argument("--measured", required=True, help="directory of a measured baseline load curve")
    sp.add_argument("--pool", help="replay pool the curve was measured with (default: the one its summary names, "
                                   "else LAKE/_pools/ENDPOINT)")
    sp.add_argument("--config", help="server config file the curve was measured on (default: the one the measured "
                                     "files record, else the endpoint's server_config)")
    sp.add_argument("--lake", default="out/lake", help="results lake root (default out/lake)")
    sp.add_argument("--params", help="comma-separated Efficiency factors to fit (default mbu plus gemm_mfu, or "
                                     "moe_mfu for MoE models)")
    sp.add_argument("--below-knee", type=float, default=0.7,
                    help="fit steps at up to this fraction of the highest passing rate (default 0.7)")
    sp.add_argument("--max-evals", type=int, default=40, help="function evaluations of the fit (default 40)")
    sp.add_argument("--restarts", type=int, default=4,
                    help="when the fit from the documented factors leaves an RMS residual above 10%%, fit again from "
                         "this many quasi-random starts inside the bounds and keep the best (default 4; 0: never)")
    sp.add_argument("--engine-version", help="engine version the curve came from, when its files do not record it")
    sp.add_argument("--dry-run", action="store_true", help="fit and print, store nothing")
    sp.set_defaults(func=_calibrate)

    ep = sub.add_parser(
        "errors", help="the endpoint's emulator error report: predicted vs measured ratios by knob family, drift",
        description="How far the calibrated emulator's capacity-ratio predictions were from the verified experiments' "
                    "measured ratios (the lake's emulator_errors table, written by campaigns): by knob family, over "
                    "time, and whether the median |error| of the last experiments drifted above the threshold.")
    ep.add_argument("--endpoint", required=True, help="endpoint name or spec file")
    ep.add_argument("--lake", default="out/lake", help="results lake root (default out/lake)")
    ep.add_argument("--window", type=int, default=3, help="experiments the drift rule looks at (default 3)")
    ep.add_argument("--threshold", type=float, default=0.10,
                    help="median |log error| above which the error drifts (default 0.10)")
    ep.set_defaults(func=_errors)


def _pool(args: argparse.Namespace, endpoint: Any, summary_pool: str | None) -> Any:
    from autoresearch_dagster.pool.adapt import adapt_to_endpoint
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.results import ResultsLake

    candidates = [args.pool] if args.pool else [p for p in (summary_pool, ResultsLake(Path(args.lake)).pool_dir(endpoint.name))
                                                if p]
    for p in candidates:
        if Path(p).exists():
            try:
                pool = read_pool(p)
            except FileNotFoundError as e:
                raise SpecError(str(e)) from None
            return adapt_to_endpoint(pool, endpoint)  # as the engine was sent it
    if args.pool:
        raise SpecError(f"--pool {args.pool} does not exist")
    raise SpecError(f"no replay pool for the measured curve (looked at {', '.join(map(str, candidates))}); pass --pool")


def _params(args: argparse.Namespace, endpoint: Any) -> tuple[str, ...]:
    from autoresearch_dagster.emulator.calibrate import endpoint_params, fittable

    if not args.params:
        return endpoint_params(endpoint)
    params = tuple(p.strip() for p in args.params.split(",") if p.strip())
    unknown = [p for p in params if p not in fittable()]
    if not params or unknown:
        raise SpecError(f"--params: cannot calibrate {', '.join(unknown) or '(nothing)'}; choose from {', '.join(sorted(fittable()))}")
    return params


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _calibrate(args: argparse.Namespace) -> int:
    from autoresearch_dagster.emulator.calibrate import below_knee, calibrate, curve_points
    from autoresearch_dagster.emulator.calibrations import StoredCalibration, save
    from autoresearch_dagster.emulator.cost import Efficiency
    from autoresearch_dagster.emulator.measured import read_measured
    from autoresearch_dagster.spec import config_hash, validate_server_config

    if not 0 < args.below_knee <= 1:
        raise SpecError(f"--below-knee must be in (0, 1], got {args.below_knee}")
    if args.restarts < 0:
        raise SpecError(f"--restarts must be >= 0, got {args.restarts}")
    if args.max_evals < 1:
        raise SpecError(f"--max-evals must be >= 1, got {args.max_evals}")
    endpoint = load_endpoint(args.endpoint)
    params = _params(args, endpoint)
    curve = read_measured(args.measured)
    config = validate_server_config(load_server_config(args.config) if args.config
                                    else curve.config if curve.config is not None else endpoint.server_config,
                                    endpoint.engine)
    steps = below_knee(curve.steps, fraction=args.below_knee)
    points = curve_points(steps)
    if len(points) < 2:
        raise SpecError(f"{curve.source}: {len(points)} load step(s) met the SLA at or below {args.below_knee:g} x the "
                        "highest passing rate; a calibration needs at least 2 (measure from a lower --start-rps)")
    pool = _pool(args, endpoint, curve.pool_path)
    version = args.engine_version or curve.engine_version or "unknown"
    print(f"calibrating {endpoint.name} ({endpoint.model} on {endpoint.gpus}x {endpoint.hardware.gpu}) on {len(points)} "
          f"steps of {curve.source} (engine {curve.engine or '?'} {version}); fitting {', '.join(params)}")
    res = calibrate(endpoint, config, pool, points, params=params, max_evals=args.max_evals,
                    request_timeout_s=curve.request_timeout_s, restarts=args.restarts)
    default = Efficiency()
    print(f"\n{'factor':<20}{'documented':>12}{'fitted':>12}{'change':>10}")
    for k, v in res.params.items():
        d = getattr(default, k)
        print(f"{k:<20}{d:>12.4g}{v:>12.4g}{_pct(v / d - 1):>10}")
    print(f"\n{'rate req/s':>10}  {'metric':<12}{'measured ms':>12}{'emulated ms':>12}{'residual':>10}")
    for row in res.predictions:
        for m, v in row.items():
            if isinstance(v, dict) and v.get("measured") is not None:
                e = v.get("emulated")
                rel = e / v["measured"] - 1 if e is not None and v["measured"] else None
                print(f"{row['rate_rps']:>10.3g}  {m:<12}{v['measured']:>12.1f}{(e if e is not None else math.nan):>12.1f}"
                      f"{_pct(rel):>10}")
    print(f"\n{'metric':<12}{'|error| before':>16}{'after':>10}{'worst after':>13}")
    for m in res.error:
        print(f"{m:<12}{res.initial_error.get(m, math.nan):>16.1%}{res.error[m]:>10.1%}{res.max_error[m]:>13.1%}")
    if not res.success:
        print(f"note: the fit stopped without converging: {res.message}")
    if args.dry_run:
        return 0
    from autoresearch_dagster.results import open_lake

    lake = open_lake(args.lake)
    stored = save(lake.root, StoredCalibration(
        endpoint=endpoint.name, engine=curve.engine or endpoint.engine, engine_version=str(version),
        model=endpoint.model, gpu=endpoint.hardware.gpu, gpus=endpoint.gpus, config_hash=config_hash(config),
        pool_hash=pool.content_hash, reason="cli", source=curve.source, params=res.params,
        efficiency=res.efficiency.__dict__, error_before=res.initial_error, error_after=res.error, points=len(points),
        n_evals=res.n_evals, success=res.success, residuals=res.predictions, detail={"kind": curve.kind,
                                                                                     "notes": curve.notes}),
        results=lake)
    print(f"\nstored calibration v{stored.version} of {endpoint.name}: {stored.path}")
    return 0


def _errors(args: argparse.Namespace) -> int:
    from autoresearch_dagster.agents.emulator_errors import error_report, to_markdown
    from autoresearch_dagster.results import open_lake

    if args.window < 1:
        raise SpecError(f"--window must be >= 1, got {args.window}")
    name = load_endpoint(args.endpoint).name if Path(args.endpoint).is_file() else args.endpoint
    lake = open_lake(args.lake)
    rows = lake.read("emulator_errors", endpoint=name)
    if not rows:
        print(f"no verified experiment of {name} has an emulator prediction in {lake.root} yet")
        return 0
    print(to_markdown(error_report(rows, window=args.window, threshold=args.threshold)))
    return 0
