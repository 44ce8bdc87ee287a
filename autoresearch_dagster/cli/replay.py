"""Owns `autoresearch replay capacity|shape`: open-loop capacity sweeps and production-shape replays.

Targets: ``--url`` (any OpenAI-compatible endpoint, measured as it is), or ``--engine emulator
--endpoint FILE`` (the embedded emulator in virtual time) / ``--engine emulator-http`` (its
real-time HTTP server), or ``--endpoint FILE`` of an ``engine: vllm`` / ``sglang`` spec (the engine is
started with the spec's server config and stopped afterwards). An endpoint's
``engine_options.adapt_pool`` adapts the pool to its limits (``pool.adapt``), printed and recorded in
summary.json's ``pool_adaptation``; summary.json's ``failures`` counts every failure class with its
first message (context too long, unsupported feature, engine crash, ...). Writes DIR/summary.json, DIR/records.parquet, DIR/load_curve.{csv,parquet}
and DIR/load_curve.png. A shape replay of an autoscaled endpoint (the spec's ``autoscaling``: an
emulated fleet, or a real endpoint whose replica gauge it names) also reports replicas over time,
scale-up latency, SLA misses during bursts and GPU-seconds (DIR/autoscaling.png, the lake's
``autoscaling`` table); ``--candidate FILE`` replays the same demand on a candidate config and
reports the GPUs it saves.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autoresearch_dagster.measure.profiles import PROFILES, REQUEST_TIMEOUT_S
from autoresearch_dagster.spec import SLA, SpecError, load_endpoint, load_server_config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("replay", help="replay a pool open-loop: capacity sweep or production shape",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="replay_cmd", metavar="MODE", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--pool", required=True, help="replay pool (directory or replay_pool.parquet)")
        sp.add_argument("--url", help="base URL of an OpenAI-compatible endpoint (with or without /v1)")
        sp.add_argument("--engine", choices=["external", "emulator", "emulator-http", "vllm", "sglang"],
                        help="engine to measure (default: external with --url, else the endpoint spec's engine)")
        sp.add_argument("--endpoint", help="endpoint spec YAML (needed for the emulator engines)")
        sp.add_argument("--sla", help="SLA, e.g. 'ttft_p99<=3000ms,tpot_p99<=60ms,errors<=1%%' "
                                      "(default: the endpoint spec's)")
        sp.add_argument("--out", required=True, help="output directory")
        sp.add_argument("--model", help="model name to send (default: endpoint spec's, else GET /v1/models)")
        sp.add_argument("--gpus", type=int, help="GPUs behind the endpoint (default: spec's hardware.count, else 1)")
        sp.add_argument("--workers", type=int, default=1, help="client worker processes (default 1)")
        sp.add_argument("--timeout", type=float,
                        help=f"per-request timeout in seconds (default {REQUEST_TIMEOUT_S:g}, every profile's)")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--api-key-env", help="environment variable holding a Bearer API key")
        sp.add_argument("--max-send-lag-ms", type=float, default=10.0,
                        help="p99 client send lag above which a step is invalid (default 10)")
        sp.add_argument("--no-flush", action="store_true", help="do not flush the prefix cache before each step")

    cap = sub.add_parser("capacity", help="highest sustained arrival rate meeting the SLA (grow + bisect)")
    common(cap)
    cap.add_argument("--measure", choices=sorted(PROFILES), default="standard",
                     help="measurement profile (measure/profiles.py; default standard); the flags below override it")
    cap.add_argument("--step-duration", type=float, help="seconds each load step is held (standard 60)")
    cap.add_argument("--min-completed", type=int, help="completed requests a step needs (standard 100)")
    cap.add_argument("--hold-e2e-multiple", type=float,
                     help="hold each step at least this many mean E2E latencies of the passing steps so far "
                          "(methods.md asks for 10; standard 0 = fixed --step-duration, quick 10)")
    cap.add_argument("--resolution", type=float, help="relative resolution of the search (standard 0.05)")
    cap.add_argument("--burstiness", type=float, help="gamma shape of inter-arrivals: 1 Poisson, <1 burstier (default 1)")
    cap.add_argument("--start-rps", type=float, help="first step's rate (default 1)")
    cap.add_argument("--growth", type=float, help="rate multiplier while growing (default 2)")
    cap.add_argument("--warmup", type=float, help="warm-up seconds before the first step (standard 10)")
    cap.add_argument("--max-steps", type=int, help="load steps at most (standard 20)")
    cap.set_defaults(func=_capacity)

    shp = sub.add_parser("shape", help="production-shaped replay at a speed-up, or search the replay capacity")
    common(shp)
    g = shp.add_mutually_exclusive_group()
    g.add_argument("--speedup", type=float, help="replay this many times faster than the pool's timeline")
    g.add_argument("--search", action="store_true", help="find the largest speed-up meeting the SLA")
    shp.add_argument("--interval", type=float, default=60.0, help="seconds per rate interval (pool timeline; default 60)")
    shp.add_argument("--resolution", type=float, default=0.05)
    shp.add_argument("--max-steps", type=int, default=12)
    shp.add_argument("--candidate", help="candidate server config (YAML/JSON) replayed on the same demand "
                                         "(emulator): GPU-seconds and GPUs saved against the spec's config")
    shp.add_argument("--replica-capacity", type=float,
                     help="req/s one replica serves within the SLA: bursts are intervals above serving x this, "
                          "for endpoints that expose no desired-replicas gauge")
    shp.add_argument("--lake", default="out/lake", help="results lake root for the autoscaling rows (default out/lake)")
    shp.set_defaults(func=_shape)


def _target(args: argparse.Namespace):
    """(deployment, sla, gpus, model, cleanup) from the command line."""
    spec = load_endpoint(args.endpoint) if args.endpoint else None
    engine = _engine_kind(args, spec)
    if args.sla:
        sla = SLA.parse(args.sla)
    elif spec is not None:
        sla = spec.sla
    else:
        raise SpecError("--sla is required when no --endpoint spec is given")
    gpus = args.gpus or (spec.gpus if spec else 1)
    if gpus < 1:
        raise SpecError(f"--gpus must be >= 1, got {gpus}")
    if args.workers < 1:
        raise SpecError(f"--workers must be >= 1, got {args.workers}")
    if engine == "external":
        from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
        url = args.url or (spec.url if spec else None)
        if not url:
            raise SpecError("--url is required for an external endpoint (or give --engine emulator --endpoint FILE)")
        settings = RunnerSettings(workers=args.workers, max_send_lag_p99_s=args.max_send_lag_ms / 1e3)
        dep = HttpDeployment(url, model=args.model, api_key_env=args.api_key_env, settings=settings)
        if not dep.health():
            raise SpecError(f"{url} is not answering (GET /health and /v1/models failed)")
        model = args.model or dep.served_model()
        auto = spec.autoscaling if spec else None
        if auto is not None and auto.replicas_metric:
            from autoresearch_dagster.engines.replicas import ReplicaWatch
            watched = ReplicaWatch(dep, metrics_url=auto.metrics_url or dep.base_url + "/metrics",
                                   replicas_metric=auto.replicas_metric, desired_metric=auto.desired_replicas_metric)
            return watched, sla, gpus, model, dep.close
        return dep, sla, gpus, model, dep.close
    if spec is None:
        raise SpecError(f"--engine {engine} needs --endpoint FILE")
    if engine in ("vllm", "sglang"):
        from autoresearch_dagster.engines import make_engine
        from autoresearch_dagster.loadgen.http_runner import RunnerSettings
        settings = RunnerSettings(workers=args.workers, max_send_lag_p99_s=args.max_send_lag_ms / 1e3)
        dep = make_engine(spec, engine=engine, settings=settings, api_key_env=args.api_key_env).deploy(
            dict(spec.server_config), seed=args.seed)
        return dep, sla, gpus, args.model or dep.served_model(), dep.close
    try:
        from autoresearch_dagster.engines.emulator import EmulatorEngine
    except ImportError as e:
        raise SpecError(f"the emulator engine is not available in this build: {e}") from None
    emu = EmulatorEngine(spec, mode="http" if engine == "emulator-http" else "virtual")
    dep = emu.deploy(dict(spec.server_config), seed=args.seed)
    runner = getattr(getattr(dep, "_dep", dep), "settings", None)  # the HTTP emulator's runner settings
    if runner is not None:
        runner.workers = args.workers
        runner.max_send_lag_p99_s = args.max_send_lag_ms / 1e3
    return dep, sla, gpus, args.model or spec.model, dep.close


def _engine_kind(args: argparse.Namespace, spec: Any) -> str:
    if args.engine:
        return args.engine
    if args.url:
        return "external"
    return spec.engine if spec is not None and spec.engine in ("vllm", "sglang") else "emulator"


def _adapt(pool: Any, args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    """The pool adapted to the endpoint's ``engine_options.adapt_pool`` limits (said aloud), else as it is."""
    if not args.endpoint:
        return pool, None
    from autoresearch_dagster.pool.adapt import adapt_to_endpoint
    adapted = adapt_to_endpoint(pool, load_endpoint(args.endpoint))
    return adapted, (adapted.adaptation if adapted is not pool else None)


def _failures(outcomes: list[Any]) -> dict[str, dict[str, Any]]:
    """Failure classes over every step: count and first message (``loadgen.failures``), engine crashes' excerpts."""
    out: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        for cls, f in (o.meta.get("failures") or {}).items():
            entry = out.setdefault(cls, {"count": 0, "message": f.get("message")})
            entry["count"] += f["count"]
        if o.meta.get("engine_crash"):
            out.setdefault("engine_crash", {"count": 0, "message": None})["excerpt"] = o.meta["engine_crash"]["excerpt"]
    return dict(sorted(out.items()))


def _check_early(args: argparse.Namespace) -> None:
    """The options that need no pool and no endpoint, checked before anything is read or started."""
    from autoresearch_dagster.cli import check_api_key_env

    check_api_key_env(args.api_key_env)
    if args.sla:
        SLA.parse(args.sla)
    if args.endpoint:
        load_endpoint(args.endpoint)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {out} is a file; it must be a directory (it is created when missing)")


def _pool(path: str):
    from autoresearch_dagster.pool.schema import read_pool
    try:
        pool = read_pool(path)
    except FileNotFoundError as e:
        raise SpecError(str(e)) from None
    if next(iter(pool.iter_requests("serving")), None) is None:
        raise SpecError(f"replay pool {path} has no serving requests to replay")
    return pool


def _capacity(args: argparse.Namespace) -> int:
    from autoresearch_dagster.measure.capacity import find_capacity
    from autoresearch_dagster.measure.profiles import measurement_profile
    from autoresearch_dagster.outputs import files, plots
    from autoresearch_dagster.outputs.console import ConsoleProgress

    _check_early(args)
    settings = measurement_profile(args.measure).with_overrides(
        step_duration_s=args.step_duration, min_completed=args.min_completed, start_rps=args.start_rps,
        growth=args.growth, resolution=args.resolution, warmup_s=args.warmup, burstiness=args.burstiness,
        max_steps=args.max_steps, request_timeout_s=args.timeout, flush_cache=not args.no_flush,
        hold_e2e_multiple=args.hold_e2e_multiple).capacity
    pool, adaptation = _adapt(_pool(args.pool), args)
    out = Path(args.out)
    dep, sla, gpus, model, close = _target(args)
    try:
        result = find_capacity(dep, pool, sla, gpus=gpus, model=model, settings=settings, seed=args.seed,
                               progress=ConsoleProgress())
        info = dep.server_info() or {}  # the engine version a calibration on this curve records
    finally:
        close()
    summary = {**result.to_dict(), "pool": str(pool.path), "pool_hash": pool.content_hash,
               "target": args.url or args.endpoint,
               "engine": _engine_kind(args, load_endpoint(args.endpoint) if args.endpoint else None),
               "model": model, "gpus": gpus, "engine_version": info.get("version"),
               "failures": _failures(result.outcomes), "pool_adaptation": adaptation,
               "server_config": dict(load_endpoint(args.endpoint).server_config) if args.endpoint else None}
    files.write_records(result.outcomes, out / "records.parquet")
    files.write_load_curve(summary["steps"], out)
    plots.plot_load_curve([(summary["steps"], result.capacity_rps)], out / "load_curve.png", sla=sla)
    files.write_json(out / "summary.json", summary)
    state = "valid" if result.valid else "INVALID: " + "; ".join(result.invalid_reasons)
    held = f" of {result.gpus_held:.3g} GPUs held" if result.gpus_held and result.gpus_held != gpus else ""
    print(f"capacity {result.capacity_rps:.4g} req/s ({result.capacity_rps_per_gpu:.4g} per GPU{held}) at {sla} "
          f"in {summary['n_steps']} steps; {state}; outputs in {out}")
    for w in result.warnings:
        print(f"caveat: {w}")
    for cls, f in summary["failures"].items():
        print(f"failures: {f['count']} {cls}" + (f" ({f['message']})" if f.get("message") else ""))
    return 0 if result.valid else 1


def _shape(args: argparse.Namespace) -> int:
    from autoresearch_dagster.measure.shape import run_shape
    from autoresearch_dagster.outputs import files, plots
    from autoresearch_dagster.outputs.console import ConsoleProgress

    _check_early(args)
    if args.speedup is not None and not args.speedup > 0:
        raise SpecError(f"--speedup must be > 0, got {args.speedup}")
    if not args.interval > 0:
        raise SpecError(f"--interval must be > 0 seconds, got {args.interval}")
    if not 0 < args.resolution < 1:
        raise SpecError(f"--resolution must be between 0 and 1 (relative), got {args.resolution}")
    if args.max_steps < 1:
        raise SpecError(f"--max-steps must be at least 1, got {args.max_steps}")
    if args.replica_capacity is not None and not args.replica_capacity > 0:
        raise SpecError(f"--replica-capacity must be > 0 req/s, got {args.replica_capacity}")
    candidate = None
    if args.candidate:
        if (args.engine or ("external" if args.url else "emulator")) != "emulator" or not args.endpoint:
            raise SpecError("--candidate needs --engine emulator --endpoint FILE (an external endpoint serves one config)")
        candidate = load_server_config(args.candidate)
    pool = _pool(args.pool)
    out = Path(args.out)
    dep, sla, gpus, model, close = _target(args)
    try:
        result = run_shape(dep, pool, sla, gpus=gpus, model=model, speedup=args.speedup, search=args.search,
                           interval_s=args.interval, seed=args.seed,
                           request_timeout_s=args.timeout or REQUEST_TIMEOUT_S,
                           resolution=args.resolution, max_steps=args.max_steps, flush_cache=not args.no_flush,
                           replica_capacity_rps=args.replica_capacity, progress=ConsoleProgress(unit="speedup"))
    finally:
        close()
    summary = {**result.to_dict(), "pool": str(pool.path), "pool_hash": pool.content_hash,
               "target": args.url or args.endpoint, "model": model, "gpus": gpus}
    cand = None
    if candidate is not None:
        cand = _candidate_shape(args, candidate, pool, sla, gpus, model, speedup=result.speedup)
        summary["candidate"] = {"config": candidate, **cand.to_dict()}
    files.write_records(result.outcomes, out / "records.parquet")
    files.write_load_curve(summary["steps"], out)
    files.write_intervals(result.intervals, out)
    plots.plot_load_curve([(summary["steps"], result.replay_capacity)], out / "load_curve.png", sla=sla,
                          speedup=True, title="Production-shape replay")
    plots.plot_intervals(result.intervals, out / "intervals.png", sla=sla, speedup=result.speedup)
    if result.autoscaling is not None:
        comparison = _autoscaling_outputs(args, result, cand, summary, out)
        summary["autoscaling_comparison"] = comparison
    files.write_json(out / "summary.json", summary)
    ok = sum(1 for i in result.intervals if i["meets_sla"])
    judged = sum(1 for i in result.intervals if i["meets_sla"] is not None)
    cap = f"replay capacity x{result.replay_capacity:.3g}; " if result.replay_capacity is not None else ""
    state = "valid" if result.valid else "INVALID: " + "; ".join(result.invalid_reasons)
    print(f"{cap}at x{result.speedup:.3g}: {ok}/{judged} intervals met {sla}; {state}; outputs in {out}")
    if result.autoscaling is not None:
        print(_autoscaling_line("autoscaling", result.autoscaling))
        if cand is not None and cand.autoscaling is not None:
            c = summary["autoscaling_comparison"]
            print(_autoscaling_line("candidate", cand.autoscaling))
            print(f"candidate vs baseline on the same demand: {c['gpu_seconds_candidate']:.0f} vs "
                  f"{c['gpu_seconds_baseline']:.0f} GPU-seconds (ratio {c['gpu_seconds_ratio']:.3f}), "
                  f"{c['mean_gpus_saved']:.2f} GPUs saved on average")
    elif cand is not None:
        print("no replica counts reported: no autoscaling report (the spec has no autoscaling section)")
    return 0 if result.valid else 1


def _candidate_shape(args: argparse.Namespace, config: dict[str, Any], pool: Any, sla: SLA, gpus: int, model: str,
                     *, speedup: float):
    """The candidate config's replay of the same per-interval demand (the baseline's speed-up), on the emulator."""
    from autoresearch_dagster.engines.emulator import EmulatorEngine
    from autoresearch_dagster.measure.shape import run_shape

    dep = EmulatorEngine(load_endpoint(args.endpoint)).deploy(config, seed=args.seed)
    try:
        return run_shape(dep, pool, sla, gpus=gpus, model=model, speedup=speedup, interval_s=args.interval,
                         seed=args.seed, request_timeout_s=args.timeout or REQUEST_TIMEOUT_S,
                         flush_cache=not args.no_flush, replica_capacity_rps=args.replica_capacity)
    finally:
        dep.close()


def _autoscaling_outputs(args: argparse.Namespace, result: Any, cand: Any, summary: dict[str, Any],
                         out: Path) -> dict[str, Any] | None:
    """autoscaling.png, the lake's autoscaling rows (baseline, candidate with its comparison); the comparison."""
    import uuid

    from autoresearch_dagster.measure.autoscaling import compare, lake_rows
    from autoresearch_dagster.outputs import plots
    from autoresearch_dagster.results import open_lake
    from autoresearch_dagster.spec import config_hash

    spec = load_endpoint(args.endpoint) if args.endpoint else None
    engine = args.engine or ("external" if args.url else "emulator")
    base_cfg = dict(spec.server_config) if spec else {}
    runs = [("baseline", result.autoscaling)]
    comparison = None
    replay_id = f"as-{uuid.uuid4().hex[:12]}"
    rows = lake_rows(result.autoscaling, replay_id=replay_id, role="baseline", config_hash=config_hash(base_cfg),
                     engine=engine, speedup=result.speedup)["autoscaling"]
    if cand is not None and cand.autoscaling is not None:
        comparison = compare(result.autoscaling, cand.autoscaling)
        runs.append(("candidate", cand.autoscaling))
        rows += lake_rows(cand.autoscaling, replay_id=f"as-{uuid.uuid4().hex[:12]}", role="candidate",
                          config_hash=config_hash(summary["candidate"]["config"]), engine=engine,
                          speedup=cand.speedup, comparison=comparison, baseline_replay_id=replay_id)["autoscaling"]
    plots.plot_autoscaling(runs, result.intervals, out / "autoscaling.png")
    open_lake(args.lake).append("autoscaling", rows, endpoint=spec.name if spec else "external")
    return comparison


def _autoscaling_line(label: str, a: dict[str, Any]) -> str:
    lat = a["scale_up_latency_median_s"]
    ups = (f"{len(a['scale_ups'])} scale-ups (demand rise to serving: median {lat:.1f} s, max "
           f"{a['scale_up_latency_max_s']:.1f} s)" if lat is not None else f"{len(a['scale_ups'])} scale-ups")
    mean = f"mean {a['mean_replicas']:.2f}" if a["mean_replicas"] is not None else "no window"
    bursts = (f"bursts {a['burst_s']:.0f} s: {a['burst_sla_misses']}/{a['burst_requests']} requests missed the SLA "
              f"(elsewhere {a['other_sla_misses']}/{a['other_requests']})" if a["burst_rule"] else
              "bursts not judged (no desired-replicas gauge and no --replica-capacity)")
    return (f"{label}: {a['gpu_seconds']:.0f} GPU-seconds ({mean} replicas x {a['gpus_per_replica']} GPUs, "
            f"{a['replicas_min']:g}-{a['replicas_max']:g}), {ups}, {a['scale_downs']} scale-downs; {bursts}")
