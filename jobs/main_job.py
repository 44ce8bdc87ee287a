"""Owns the main job's in-process driver and its `autoresearch run` command: what the daemon would do,
tick by tick, as real Dagster runs on a persistent instance at DAGSTER_HOME (what `dagster dev` then shows).

The core's CLI reaches this module through the ``autoresearch.commands`` entry point (pyproject.toml),
so the core never imports the Dagster layer.
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import dagster as dg

from autoresearch_dagster.definitions import PROJECT_ROOT, build_defs
from autoresearch_dagster.measure.profiles import PROFILES
from jobs.instance import QUIET, execute, instance, observe_engine_version
from resources import MeasurementSettings
from sensors import endpoint_discovery_sensor, promotion_sensor
from sensors.discovery import FIRST_RUN_ASSETS

ROUND_ASSETS = ["noise_baseline", "diagnostic_report", "proposals", "experiment_results", "promotion_decision"]
MAIN_TAG = "autoresearch/main_job"


def _merge_config(run_config: dict | None) -> dict:
    return {**(run_config or {}), **QUIET}


def _execute_quiet(defs: dg.Definitions, instance: dg.DagsterInstance, partition: str, assets: list[dg.AssetKey],
                   **kw) -> dg.ExecuteInProcessResult:
    """A main-job run: console logging off, failures returned (and judged by _run_checked)."""
    return execute(defs, instance, partition, assets, raise_on_error=False,
                   **{**kw, "run_config": _merge_config(kw.get("run_config"))})


def _latest_storage_id(instance: dg.DagsterInstance, key: str) -> int | None:
    recs = instance.fetch_materializations(dg.AssetKey(key), limit=1, ascending=False).records
    return recs[0].storage_id if recs else None


def _latest(instance: dg.DagsterInstance, key: str, partition: str) -> tuple[int, dict]:
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition]), limit=1).records
    if not recs:
        return -1, {}
    return recs[0].storage_id, {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}


def _blocking_check_failures(result: dg.ExecuteInProcessResult) -> list[str]:
    """Names of the blocking checks that failed in a run (Dagster fails the run and skips downstream)."""
    return [f"{e.event_specific_data.asset_key.to_user_string()}: {e.event_specific_data.check_name}"
            for e in result.all_events
            if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION and not e.event_specific_data.passed
            and e.event_specific_data.severity == dg.AssetCheckSeverity.ERROR]


def _run_checked(say, what: str, run) -> dg.ExecuteInProcessResult:
    """Execute ``run()`` (one Dagster run), report it with its wall time. A run stopped by a failed
    blocking check is an outcome of the loop (reported, downstream skipped); any other failure raises."""
    t0 = time.monotonic()
    result = run()
    blocked = _blocking_check_failures(result) if not result.success else []
    status = "ok" if result.success else f"stopped by blocking check {', '.join(blocked)}" if blocked else "FAILED"
    say(f"  run {result.run_id[:8]} {what}: {status} ({time.monotonic() - t0:.0f} s)")
    if not result.success and not blocked:
        failures = [e.message for e in result.all_events if e.is_failure]
        raise RuntimeError(f"Dagster run {result.run_id} ({what}) failed: {failures[:1]}")
    return result


def _requested_by_tick(result: dg.EvaluateAutomationConditionsResult) -> dict[str | None, set[dg.AssetKey]]:
    by_partition: dict[str | None, set[dg.AssetKey]] = {}
    for r in result.results:
        if isinstance(r.key, dg.AssetKey) and r.true_subset.size > 0:
            for p in result.get_requested_partitions(r.key):
                by_partition.setdefault(p, set()).add(r.key)
    return by_partition


def _round_summary(instance: dg.DagsterInstance, name: str, label: str) -> dict:
    _, noise = _latest(instance, "noise_baseline", name)
    exp_id, exp = _latest(instance, "experiment_results", name)
    dec_id, dec = _latest(instance, "promotion_decision", name)
    _, base = _latest(instance, "confirmed_baseline", name)
    if dec_id < exp_id:  # the blocking correctness gate stopped the round before its decision
        dec = {"promote": False, "reason": "no decision: a failed blocking check (correctness_gate) stopped it"}
    v = (exp.get("verdicts") or [{}])[0]
    return {"round": label, "baseline": f"{base.get('candidate_id')} ({base.get('config_hash')})",
            "capacity_rps": noise.get("capacity_rps"), "noise_cv": noise.get("capacity_cv"),
            "candidate": v.get("candidate_id", "-"), "verdict": v.get("verdict", "-"),
            "ratio": v.get("ratio_median"), "ci": (v.get("ci_low"), v.get("ci_high")),
            "promote": dec.get("promote"), "reason": dec.get("reason", "")}


def _fmt(x: float | None, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def run_main_job(endpoint_path: str | Path, *, out_dir: str | Path | None = None,
                 candidates_dir: str | Path | None = None, settings: MeasurementSettings | None = None,
                 home: str | Path | None = None, storage: str | None = None, say=print) -> dict:
    """The demo loop through real Dagster runs on a persistent instance (what `dagster dev` shows):
    discovery → pool + fidelity + baseline → engine observation → one round (noise floor,
    diagnosis, proposals, experiment, decision) → promotion via the promotion sensor's run request
    → the lineage rerun the automation sensor requests, tick by tick. Returns the summary rows."""
    from autoresearch_dagster.results import ResultsLake
    from autoresearch_dagster.spec import load_endpoint

    spec = load_endpoint(endpoint_path)
    name = spec.name
    spec_dir = Path(endpoint_path).resolve().parent
    out = Path(out_dir or PROJECT_ROOT / "out").resolve()
    if candidates_dir is None:
        beside = spec_dir.parent / "candidates"
        candidates_dir = beside if beside.is_dir() else PROJECT_ROOT / "examples" / "candidates"
    settings = settings or MeasurementSettings(profile="quick")
    inst = instance(home, storage)
    defs = build_defs(out_dir=str(out), spec_dir=str(spec_dir), candidates_dir=str(candidates_dir),
                      settings=settings)
    registry = defs.resources["registry"]
    say(f"instance: {inst.root_directory} ({type(inst.run_storage).__name__}); artifacts: {out}")

    # A demo run starts the campaign from the spec's config: the previous run's working files move aside
    # (the results lake keeps every row).
    work = out / name
    if work.exists():
        previous = out / f"{name}.previous"
        if previous.exists():
            shutil.rmtree(previous)
        work.rename(previous)

    say("1. endpoint discovery sensor")
    tick = endpoint_discovery_sensor(dg.build_sensor_context(instance=inst, resources={"registry": registry}))
    if isinstance(tick, dg.SensorResult) and tick.dynamic_partitions_requests:
        for req in tick.dynamic_partitions_requests:
            inst.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        say(f"  added endpoint partitions: {[k for r in tick.dynamic_partitions_requests for k in r.partition_keys]}")
        requests = tick.run_requests
    else:
        say(f"  {name!r} already known: re-seeding its pool and baseline from the spec")
        requests = [dg.RunRequest(partition_key=name, asset_selection=FIRST_RUN_ASSETS,
                                  tags={"autoresearch/endpoint": name, MAIN_TAG: "reseed"})]
    for req in requests:
        _run_checked(say, f"{req.partition_key}: replay_pool + replay_fidelity + confirmed_baseline",
                     lambda req=req: _execute_quiet(defs, inst, req.partition_key, list(req.asset_selection),
                                                    tags=dict(req.tags)))

    say("2. engine_version observation")
    _run_checked(say, "observe engine_version", lambda: observe_engine_version(defs, inst))

    decisions_before = _latest_storage_id(inst, "promotion_decision")
    say("3. round 1: noise_baseline → diagnostic_report → proposals → experiment_results → promotion_decision")
    _run_checked(say, "round 1", lambda: _execute_quiet(defs, inst, name, [dg.AssetKey(k) for k in ROUND_ASSETS],
                                                        tags={MAIN_TAG: "round-1"}))
    rounds = [_round_summary(inst, name, "1")]
    report = json.loads((out / name / "diagnostic_report" / "report.json").read_text())
    say("  top hypotheses: " + "; ".join(f"{h['bottleneck']} ({h['score']:.2f}, try {', '.join(h['knobs'][:3])})"
                                         for h in report["hypotheses"][:3]))
    auto = dg.evaluate_automation_conditions(defs=defs, instance=inst)  # the automation sensor's first tick

    say("4. promotion sensor")
    tick = promotion_sensor(dg.build_sensor_context(
        instance=inst, cursor=str(decisions_before) if decisions_before is not None else None))
    mine = [r for r in tick.run_requests if r.partition_key == name]
    if not mine:
        say(f"  no promotion: {rounds[0]['reason']}")
    for req in mine:
        cfg = req.run_config["ops"]["confirmed_baseline"]["config"]
        _run_checked(say, f"promote {cfg['candidate_id']} (run_key {req.run_key})",
                     lambda req=req: _execute_quiet(defs, inst, name, list(req.asset_selection),
                                                    run_config=req.run_config,
                                                    tags={**req.tags, "dagster/sensor_name": "promotion_sensor",
                                                          "dagster/run_key": req.run_key}))

        say("5. lineage rerun: automation sensor ticks (evaluate_automation_conditions)")
        for n in range(1, 6):
            auto = dg.evaluate_automation_conditions(defs=defs, instance=inst, cursor=auto.cursor)
            wanted = _requested_by_tick(auto)
            if not wanted:
                say(f"  tick {n}: nothing requested")
                break
            for partition, keys in wanted.items():
                names = sorted(k.to_user_string() for k in keys)
                say(f"  tick {n}: requested {names} for {partition or 'all endpoints'}")
                if dg.AssetKey("engine_version") in keys:
                    _run_checked(say, "observe engine_version", lambda: observe_engine_version(defs, inst))
                    keys = keys - {dg.AssetKey("engine_version")}
                if keys and partition is not None:
                    _run_checked(say, f"automation tick {n}", lambda p=partition, k=keys, n=n: _execute_quiet(
                        defs, inst, p, sorted(k, key=lambda a: a.to_user_string()),
                        tags={MAIN_TAG: f"automation-tick-{n}"}))
        rounds.append(_round_summary(inst, name, "2 (after promotion)"))

    last = rounds[-1]
    if len(rounds) > 1 and last["promote"]:
        say(f"round 2 decided to promote {last['candidate']}: the promotion sensor promotes it under "
            "`dagster dev` (and the automation reruns the lineage again)")
    lake = ResultsLake(out / "lake")
    lake.refresh_views()
    say("")
    say(f"{'round':<20} {'baseline':<28} {'capacity rps':>12} {'noise CV':>9} {'candidate':<30} "
        f"{'verdict':<8} {'ratio [CI]':<22} promote")
    for r in rounds:
        ci = f"{_fmt(r['ratio'], '.3f')} [{_fmt(r['ci'][0], '.3f')}, {_fmt(r['ci'][1], '.3f')}]"
        say(f"{r['round']:<20} {r['baseline']:<28} {_fmt(r['capacity_rps'], '12.2f')} "
            f"{_fmt(r['noise_cv'], '9.2%')} {r['candidate']:<30} {r['verdict']:<8} {ci:<22} {r['promote']}")
    for r in rounds:
        say(f"  round {r['round']}: {r['reason']}")
    say("")
    say("where to look:")
    say(f"  DuckDB views:   duckdb {lake.duckdb_path()}   (or: autoresearch sql \"SELECT * FROM verdict_history\")")
    say(f"  plots:          {out / name / 'noise_baseline' / 'load_curves.png'}, "
        f"{out / name / 'experiment_results' / 'ratios.png'}, {out / name / 'diagnostic_report'}/*.png")
    say(f"  diagnosis:      {out / name / 'diagnostic_report' / 'report.md'}")
    say(f"  Dagster UI:     DAGSTER_HOME={inst.root_directory} dagster dev -w workspace.yaml")
    return {"rounds": rounds, "duckdb": str(lake.duckdb_path()), "dagster_home": inst.root_directory,
            "out": str(out)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run the loop for one endpoint through Dagster (pool → verdict → promotion → rerun)",
        description="The main job, through real Dagster runs on a persistent instance at DAGSTER_HOME "
                    "(default ./.dagster_home, SQLite): endpoint discovery, the replay pool and its "
                    "fidelity check, the baseline's noise floor and load curve, diagnosis, proposals, "
                    "one experiment with its verdict, the promotion through the promotion sensor and "
                    "the lineage rerun the automation sensor requests. Prints a results table and "
                    "where to look; `dagster dev -w workspace.yaml` then shows the runs and lineage.")
    p.add_argument("--endpoint", required=True, help="endpoint spec file (YAML/JSON)")
    p.add_argument("--out", help="artifacts and results lake (default ./out)")
    p.add_argument("--candidates", help="candidate config files <endpoint>_*.yaml "
                                        "(default: ../candidates beside the spec, else examples/candidates)")
    p.add_argument("--measure", choices=sorted(PROFILES), default="quick",
                   help="measurement profile (measure/profiles.py); quick (default): 5 runs per arm without "
                        "escalation and the quick diagnosis; standard: 5 → 10 → 20 runs per arm and the "
                        "full diagnosis")
    p.add_argument("--dagster-home", help="instance directory (default $DAGSTER_HOME, else ./.dagster_home)")
    p.add_argument("--storage", choices=["sqlite", "postgres"],
                   help="instance storage (default $AUTORESEARCH_DAGSTER_STORAGE, else sqlite); "
                        "postgres reads DAGSTER_PG_HOST/PORT/USERNAME/DB")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    settings = MeasurementSettings(profile=args.measure)
    run_main_job(Path(args.endpoint), out_dir=args.out, candidates_dir=args.candidates, settings=settings,
                 home=args.dagster_home, storage=args.storage)
    return 0
