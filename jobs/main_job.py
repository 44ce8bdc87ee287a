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
from resources import CampaignResource, MeasurementSettings
from sensors import campaign_sensor, endpoint_discovery_sensor, promotion_sensor
from sensors.discovery import FIRST_RUN_ASSETS
from sensors.orphans import fail_orphaned_runs

ROUND_ASSETS = ["noise_baseline", "diagnostic_report", "proposals", "experiment_results", "promotion_decision"]
MAIN_TAG = "autoresearch/main_job"
MAX_TICKS = 60  # a campaign ends by its own budget long before; this only stops a loop that stalls


DEMO_CAMPAIGN = {"budget_experiments": 9, "deadline_min": 6.5, "concurrent_gpus": 2, "experiments_per_round": 3,
                 "directions_per_round": 3, "search_trials": 2}


def demo_campaign(**overrides) -> CampaignResource:
    """make run's campaign: a few rounds on 2 virtual GPUs, ending well inside 10 minutes on 2 cores."""
    return CampaignResource(**{**DEMO_CAMPAIGN, **overrides})


def _merge_config(run_config: dict | None) -> dict:
    return {**(run_config or {}), **QUIET}


def _execute_quiet(defs: dg.Definitions, instance: dg.DagsterInstance, partition: str, assets: list[dg.AssetKey],
                   **kw) -> dg.ExecuteInProcessResult:
    """A main-job run: console logging off, failures returned (and judged by _run_checked)."""
    return execute(defs, instance, partition, assets, raise_on_error=False,
                   **{**kw, "run_config": _merge_config(kw.get("run_config"))})


def _latest(instance: dg.DagsterInstance, key: str, partition: str) -> tuple[int, dict]:
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition]), limit=1).records
    if not recs:
        return -1, {}
    return recs[0].storage_id, {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}


def _latest_storage_id(instance: dg.DagsterInstance, key: str) -> int | None:
    recs = instance.fetch_materializations(dg.AssetKey(key), limit=1, ascending=False).records
    return recs[0].storage_id if recs else None


def _blocking_check_failures(result: dg.ExecuteInProcessResult) -> list[str]:
    """The blocking checks that failed in a run (Dagster fails the run and skips downstream), each with
    what it said."""
    return [f"{e.event_specific_data.asset_key.to_user_string()}: {e.event_specific_data.check_name}"
            + (f" ({e.event_specific_data.description})" if e.event_specific_data.description else "")
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


def _execute_request(defs, inst, say, req: dg.RunRequest, sensor: str) -> None:
    keys = list(req.asset_selection or [])
    what = ", ".join(k.to_user_string() for k in keys)
    _run_checked(say, f"{sensor} -> {what}", lambda: _execute_quiet(
        defs, inst, req.partition_key, keys, run_config=req.run_config,
        tags={**req.tags, "dagster/sensor_name": sensor, **({"dagster/run_key": req.run_key} if req.run_key else {})}))


def run_main_job(endpoint_path: str | Path, *, out_dir: str | Path | None = None,
                 settings: MeasurementSettings | None = None, campaign: CampaignResource | None = None,
                 home: str | Path | None = None, storage: str | None = None, say=print) -> dict:
    """A research campaign on one endpoint through real Dagster runs on a persistent instance (what
    `dagster dev` then shows): discovery -> pool + fidelity + baseline -> engine observation -> the
    first round (noise floor, diagnosis, proposals, experiments, decision) -> then, tick by tick, what
    the daemon would do: the promotion sensor's promotions and the lineage reruns the automation sensor
    requests after them, the campaign sensor's next rounds, and at the end its report and review
    package. Returns the campaign report."""
    from autoresearch_dagster.campaign.report import format_report
    from autoresearch_dagster.results import ResultsLake
    from autoresearch_dagster.spec import load_endpoint

    spec = load_endpoint(endpoint_path)
    name = spec.name
    spec_dir = Path(endpoint_path).resolve().parent
    out = Path(out_dir or PROJECT_ROOT / "out").resolve()
    settings = settings or MeasurementSettings(profile="quick")
    campaign = campaign or demo_campaign()
    inst = instance(home, storage)
    defs = build_defs(out_dir=str(out), spec_dir=str(spec_dir), settings=settings, campaign=campaign,
                      memory_dir=str(out / "memory"))
    registry = defs.resources["registry"]
    say(f"instance: {inst.root_directory} ({type(inst.run_storage).__name__}); artifacts: {out}")
    for run_id in fail_orphaned_runs(inst):  # a killed earlier driver would otherwise hold its GPU slot forever
        say(f"  run {run_id} was killed mid-flight: marked failed, its GPU slot given back")

    # A demo run starts a campaign from the spec's config: the previous run's working files move aside
    # (the results lake and the memory keep every row).
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
        say(f"  {name!r} already known: re-seeding its pool and baseline from the spec (a new campaign)")
        requests = [dg.RunRequest(partition_key=name, asset_selection=FIRST_RUN_ASSETS,
                                  tags={"autoresearch/endpoint": name, MAIN_TAG: "reseed"})]
    for req in requests:
        _run_checked(say, f"{req.partition_key}: replay_pool + replay_fidelity + confirmed_baseline",
                     lambda req=req: _execute_quiet(defs, inst, req.partition_key, list(req.asset_selection),
                                                    tags=dict(req.tags)))

    say("2. engine_version observation")
    _run_checked(say, "observe engine_version", lambda: observe_engine_version(defs, inst))

    cursors = {"promotion": _latest_storage_id(inst, "promotion_decision"),
               "campaign": _latest_storage_id(inst, "promotion_decision")}
    reports_before, _ = _latest(inst, "campaign_report", name)
    say("3. round 1: noise_baseline -> diagnostic_report -> proposals -> experiment_results (one step per "
        "experiment) -> promotion_decision")
    _run_checked(say, "round 1", lambda: _execute_quiet(defs, inst, name, [dg.AssetKey(k) for k in ROUND_ASSETS],
                                                        tags={MAIN_TAG: "round-1"}))
    auto = dg.evaluate_automation_conditions(defs=defs, instance=inst)  # the automation sensor's first tick

    say("4. the daemon's ticks: promotion sensor, automation sensor, campaign sensor")
    for n in range(1, MAX_TICKS + 1):
        ran = False
        tick = promotion_sensor(dg.build_sensor_context(instance=inst, cursor=None if cursors["promotion"] is None
                                                        else str(cursors["promotion"])))
        cursors["promotion"] = int(tick.cursor) if tick.cursor else cursors["promotion"]
        for req in [r for r in tick.run_requests if r.partition_key == name]:
            cfg = req.run_config["ops"]["confirmed_baseline"]["config"]
            say(f"  tick {n}: promotion sensor promotes {cfg['candidate_id']}")
            _execute_request(defs, inst, say, req, "promotion_sensor")
            ran = True
        # the automation sensor ticks until it requests nothing more; every run it requested is executed before
        # the next tick (a tick that sees an asset's own new materialization together with its dependency's
        # treats the dependency's update as handled: dagster.md, "materialize what a tick requested")
        for _ in range(5):
            auto = dg.evaluate_automation_conditions(defs=defs, instance=inst, cursor=auto.cursor)
            wanted = _requested_by_tick(auto)
            if not wanted:
                break
            for partition, keys in wanted.items():
                names = sorted(k.to_user_string() for k in keys)
                say(f"  tick {n}: automation sensor requests {names} for {partition or 'all endpoints'}")
                if dg.AssetKey("engine_version") in keys:
                    _run_checked(say, "observe engine_version", lambda: observe_engine_version(defs, inst))
                    keys = keys - {dg.AssetKey("engine_version")}
                if keys and partition is not None:
                    _run_checked(say, f"automation tick {n}", lambda p=partition, k=keys, n=n: _execute_quiet(
                        defs, inst, p, sorted(k, key=lambda a: a.to_user_string()),
                        tags={MAIN_TAG: f"automation-tick-{n}"}))
                    ran = True
        tick = campaign_sensor(dg.build_sensor_context(instance=inst, cursor=None if cursors["campaign"] is None
                                                       else str(cursors["campaign"])))
        cursors["campaign"] = int(tick.cursor) if tick.cursor else cursors["campaign"]
        for req in [r for r in tick.run_requests if r.partition_key == name]:
            say(f"  tick {n}: campaign sensor requests the {req.tags.get('autoresearch/next')}")
            _execute_request(defs, inst, say, req, "campaign_sensor")
            auto = dg.evaluate_automation_conditions(defs=defs, instance=inst, cursor=auto.cursor)  # sees that run
            ran = True
        if _latest(inst, "campaign_report", name)[0] > reports_before:
            break
        if not ran:
            say(f"  tick {n}: nothing requested; the loop stalled before its report")
            break

    report_path = out / name / "campaign" / "campaign.json"
    lake = ResultsLake(out / "lake")
    lake.refresh_views()
    if not report_path.exists():
        raise RuntimeError(f"the campaign ended without its report ({report_path})")
    report = json.loads(report_path.read_text())
    say("")
    say(format_report(report))
    say(f"  DuckDB views:   duckdb {lake.duckdb_path()}   (or: autoresearch sql \"SELECT * FROM prediction_scores\")")
    say(f"  Dagster UI:     DAGSTER_HOME={inst.root_directory} dagster dev -w workspace.yaml")
    say(f"  approve:        dagster job launch -j approve_production (or: autoresearch campaign approve --review "
        f"{report['paths']['review']} --who NAME --decision approve)")
    return {"report": report, "duckdb": str(lake.duckdb_path()), "dagster_home": inst.root_directory, "out": str(out)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run a research campaign for one endpoint through Dagster (the main job: make run)",
        description="The main job, through real Dagster runs on a persistent instance at DAGSTER_HOME "
                    "(default ./.dagster_home, SQLite): endpoint discovery, the replay pool and its fidelity "
                    "check, then a research campaign: the baseline's noise floor and diagnosis, rounds of the "
                    "system's own proposals run as experiments with verdicts, promotions through the promotion "
                    "sensor and the lineage reruns the automation sensor requests, the next rounds through the "
                    "campaign sensor, and at the end the campaign report and its review package. Prints the "
                    "results table and where to look; `dagster dev -w workspace.yaml` then shows the runs.")
    p.add_argument("--endpoint", required=True, help="endpoint spec file (YAML/JSON)")
    p.add_argument("--out", help="artifacts, results lake and memory (default ./out)")
    p.add_argument("--measure", choices=sorted(PROFILES), default="quick",
                   help="measurement profile (measure/profiles.py); quick (default): steady-state holds, 5 runs "
                        "per arm; standard: 5 -> 10 -> 20 runs per arm and the full diagnosis")
    p.add_argument("--budget-experiments", type=int, default=9)
    p.add_argument("--deadline-min", type=float, default=6.5, help="the campaign's deadline (default 6.5 minutes)")
    p.add_argument("--concurrent-gpus", type=int, default=2)
    p.add_argument("--proposer", choices=["offline", "claude", "both"], default="offline")
    p.add_argument("--dagster-home", help="instance directory (default $DAGSTER_HOME, else ./.dagster_home)")
    p.add_argument("--storage", choices=["sqlite", "postgres"],
                   help="instance storage (default $AUTORESEARCH_DAGSTER_STORAGE, else sqlite); "
                        "postgres reads DAGSTER_PG_HOST/PORT/USERNAME/DB")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    settings = MeasurementSettings(profile=args.measure)
    campaign = demo_campaign(budget_experiments=args.budget_experiments, deadline_min=args.deadline_min,
                             concurrent_gpus=args.concurrent_gpus, proposer=args.proposer)
    run_main_job(Path(args.endpoint), out_dir=args.out, settings=settings, campaign=campaign,
                 home=args.dagster_home, storage=args.storage)
    return 0
