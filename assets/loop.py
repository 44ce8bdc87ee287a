"""Owns the loop assets: confirmed_baseline (root), noise_baseline (with the blocking replay_vs_production
check: the pool replayed on the production config against what production did), diagnostic_report, proposals,
experiment_results (one step per experiment; the blocking correctness_gate check), promotion_decision and
campaign_report; every step that loads an engine takes a slot of the ``gpu`` concurrency pool. Thin: each
steps the core's ``CampaignRunner`` once and attaches metadata; the campaign's state, rounds, traces and
review package live in the artifact store, rows in the results lake. The back edges (promotion, the next round, the
report at the end) are sensors, not dependencies."""
import json
import math
from typing import Any

import dagster as dg

from assets.config import GPU_POOL, PROMOTED_FROM_TAG, BaselineConfig
from assets.metadata import png_markdown
from assets.partitions import EAGER, endpoints
from autoresearch_dagster.outputs.files import json_safe
from autoresearch_dagster.outputs.plots import plot_load_curve, plot_ratios
from resources import (
    ArtifactStore,
    CampaignResource,
    EndpointRegistry,
    EngineFactory,
    MeasurementSettings,
    MemoryStore,
    ResultsLakeResource,
)

LOOP = "loop"
POOL = dg.AssetKey("replay_pool")
ENGINE = dg.AssetKey("engine_version")


def runner(context: Any, registry: EndpointRegistry, engines: EngineFactory, settings: MeasurementSettings,
           store: ArtifactStore, lake: ResultsLakeResource, memory: MemoryStore, campaign: CampaignResource) -> Any:
    """The endpoint's campaign runner over its saved state (what every loop step advances); the campaign
    restarts when confirmed_baseline was seeded again (its ``origin``)."""
    from autoresearch_dagster.pool.schema import read_pool

    name = context.partition_key
    spec = registry.load(name)
    results = lake.lake()
    origin = store.read_json(name, "confirmed_baseline", "baseline.json").get("origin")
    return campaign.runner(spec, read_pool(results.pool_dir(name)), engine=engines.make(spec),
                           out_dir=store.dir(name, "campaign"), measurement=settings.measurement_profile(),
                           results=results, memory_dir=memory.dir(), seed=settings.seed,
                           probes=settings.diagnosis_probes, say=context.log.info, origin=origin)


def autoscaling_metadata(a: dict[str, Any], plot: str | None) -> dict[str, Any]:
    """An autoscaled replay's report as metadata: GPU-seconds, replicas, scale-up latency, SLA misses in bursts,
    the plot (path and embedded)."""
    def num(x: Any) -> float:
        return float(x) if x is not None else float("nan")

    md = (f"GPU-seconds {a['gpu_seconds']:.0f} (mean {num(a['mean_replicas']):.2f} replicas x {a['gpus_per_replica']} "
          f"GPUs, {a['replicas_min']:g}-{a['replicas_max']:g}), {len(a['scale_ups'])} scale-ups (median latency "
          f"{num(a['scale_up_latency_median_s']):.1f} s), {a['scale_downs']} scale-downs; SLA misses in bursts "
          f"{a['burst_sla_misses']}/{a['burst_requests']}, elsewhere {a['other_sla_misses']}/{a['other_requests']}")
    out: dict[str, Any] = {
        "autoscaling/gpu_seconds": float(a["gpu_seconds"]), "autoscaling/mean_replicas": num(a["mean_replicas"]),
        "autoscaling/replicas_max": float(a["replicas_max"]), "autoscaling/scale_ups": len(a["scale_ups"]),
        "autoscaling/scale_up_latency_median_s": num(a["scale_up_latency_median_s"]),
        "autoscaling/scale_up_latency_max_s": num(a["scale_up_latency_max_s"]),
        "autoscaling/burst_sla_misses": int(a["burst_sla_misses"] or 0),
        "autoscaling/burst_requests": int(a["burst_requests"] or 0),
        "autoscaling/other_sla_misses": int(a["other_sla_misses"] or 0)}
    if plot:
        out["autoscaling/plot"] = dg.MetadataValue.path(plot)
        md += "\n\n" + png_markdown(plot, "autoscaling")
    out["autoscaling/report"] = dg.MetadataValue.md(md)
    return out


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "\n".join("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows)


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json"})
def confirmed_baseline(context: dg.AssetExecutionContext, config: BaselineConfig, registry: EndpointRegistry,
                       engines: EngineFactory, settings: MeasurementSettings, store: ArtifactStore,
                       lake: ResultsLakeResource, memory: MemoryStore, campaign: CampaignResource) -> dg.MaterializeResult:
    """The working baseline server config of the endpoint. A root asset: seeded from the endpoint spec
    by the discovery sensor (which starts a campaign) and re-materialized with a candidate's config by
    the promotion sensor (the loop's back edge). The campaign's original baseline stays its reference."""
    from autoresearch_dagster.spec import config_hash, validate_server_config

    name = context.partition_key
    source_run = context.run.tags.get(PROMOTED_FROM_TAG)
    if source_run and config.server_config_json:  # the promotion back edge: the campaign's next era
        r = runner(context, registry, engines, settings, store, lake, memory, campaign)
        era = r.set_baseline(validate_server_config(json.loads(config.server_config_json)),
                             experiment_id=config.experiment_id or None)
        origin, campaign_id, original = r.state.origin, r.state.campaign_id, r.state.original.config
        cfg, h, index, delta, set_at = era.config, era.config_hash, era.index, era.delta, era.set_at
    else:  # seeded from the spec: a new campaign starts from this run (the next step builds its state)
        spec = registry.load(name)
        origin, campaign_id, original = context.run.run_id, "", dict(spec.server_config)
        cfg, h, index, delta, set_at = dict(spec.server_config), config_hash(spec.server_config), 0, {}, None
    record = {"endpoint": name, "campaign_id": campaign_id, "origin": origin, "candidate_id": config.candidate_id,
              "server_config": cfg, "config_hash": h, "era": index, "original_config": original,
              "original_config_hash": config_hash(original), "promoted_from_run": source_run,
              "experiment_id": config.experiment_id or None, "run_id": context.run.run_id, "set_at": set_at}
    path = store.write_json(name, "confirmed_baseline", "baseline.json", record)
    store.write_json(name, "confirmed_baseline", f"history/{context.run.run_id}.json", record)
    metadata: dict[str, Any] = {
        "candidate_id": config.candidate_id, "config_hash": h, "era": index, "campaign_origin": origin,
        "server_config": dg.MetadataValue.json(json_safe(cfg)), "delta": dg.MetadataValue.json(json_safe(delta)),
        "is_original": index == 0, "path": dg.MetadataValue.path(str(path)),
    }
    if source_run and not source_run.startswith("runless-"):
        metadata["promoted_from"] = dg.MetadataValue.dagster_run(source_run)
    return dg.MaterializeResult(data_version=dg.DataVersion(f"{origin}:{h}"), metadata=metadata)


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"parquet", "json"}, automation_condition=EAGER,
          deps=[confirmed_baseline, POOL, ENGINE], pool=GPU_POOL)
def noise_baseline(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                   settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource,
                   memory: MemoryStore, campaign: CampaignResource) -> dg.MaterializeResult:
    """The working baseline's noise floor: repeated independent capacity searches (fresh deployment per
    run) -> capacity CV and the CI of the median, plus its load curves. These runs are the shared
    control of the baseline's rounds; after a promotion they also check that the gain replicates."""
    r = runner(context, registry, engines, settings, store, lake, memory, campaign)
    era = r.measure()
    name = r.endpoint.name
    if not era.noise:
        return dg.MaterializeResult(metadata={"campaign_ended": True, "reason": str(r.state.ended_because)})
    n = era.noise
    noise = json.loads((r._era_dir() / "noise.json").read_text())
    plot = plot_load_curve([(x["steps"], x["capacity_rps"]) for x in noise["run_details"]],
                           store.dir(name, "noise_baseline") / "load_curves.png", sla=r.endpoint.sla,
                           band=(n["ci_low"], n["ci_high"]), title=f"{name}: baseline load curves ({n['runs']} runs)")
    rep = era.replication
    md = (f"**{name}** era {era.index} baseline `{era.config_hash}`: median capacity {n['median']:.3f} req/s "
          f"(CI {n['ci_low']:.3f}–{n['ci_high']:.3f}), CV {n['cv']:.2%} over {n['runs']} runs, verdict margin "
          f"{n['margin']:.2%}" + (f"; the promotion re-measured at {rep['ratio']:.3f}x the previous baseline "
                                  f"({'replicated' if rep['replicated'] else 'NOT replicated'})" if rep else "")
          + "\n\n" + png_markdown(plot, "load curves"))
    return dg.MaterializeResult(
        data_version=dg.DataVersion(n["noise_id"]),
        metadata={"capacity_rps": float(n["median"]),
                  "capacity_rps_per_gpu": float(n["median"]) / float(n.get("gpus_held") or r.endpoint.gpus),
                  "gpus_held": float(n.get("gpus_held") or r.endpoint.gpus),
                  "capacity_cv": float(n["cv"]), "runs": int(n["runs"]), "margin": float(n["margin"]),
                  "capacities": dg.MetadataValue.json(n["capacities"]), "engine_version": str(n["engine_version"]),
                  "replicated": bool(rep["replicated"]) if rep else True, "era": era.index,
                  "report": dg.MetadataValue.md(md), "plot": dg.MetadataValue.path(str(plot))})


@dg.asset_check(asset=noise_baseline, blocking=True, partitions_def=endpoints, pool=GPU_POOL,
                # requested with noise_baseline, so a tick can request what is below it in the same run; not again
                # after (or while) a run that executes it with noise_baseline (a sensor's run: the engine-version
                # re-measure; a tick between the asset and its check must not request the check again)
                automation_condition=dg.AutomationCondition.any_deps_updated().since(
                    dg.AutomationCondition.newly_requested() | dg.AutomationCondition.newly_updated())
                & ~dg.AutomationCondition.in_progress(),
                description="The pool replays as production ran: the production config replays it at production "
                            "speed, and the engine's cached-input tokens, in-flight requests over time, arrival "
                            "timing and token lengths after redaction match what the log says production did. A "
                            "failure names each property that drifted and by how much; no candidate is compared "
                            "against a baseline measured on an unfaithful pool.")
def replay_vs_production(context: dg.AssetCheckExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                         settings: MeasurementSettings, store: ArtifactStore,
                         lake: ResultsLakeResource) -> dg.AssetCheckResult:
    from autoresearch_dagster.experiments.production_replay import replay_production
    from autoresearch_dagster.pool.production import read_production
    from autoresearch_dagster.pool.production_fidelity import format_report
    from autoresearch_dagster.pool.schema import read_pool

    name = context.partition_key
    spec = registry.load(name)
    results = lake.lake()
    home = results.pool_dir(name)
    try:
        production = read_production(home)
    except FileNotFoundError as e:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, description=str(e))
    run = replay_production(spec, read_pool(home), production, engine=engines.make(spec), seed=settings.seed,
                            request_timeout_s=settings.request_timeout_s)
    report = run.report
    path = run.save(store.dir(name, "noise_baseline"))
    results.append_rows(run.lake_rows(), endpoint=name)
    text = format_report(report)
    context.log.info(text)
    failed = [c for c in report["checks"] if not c["passed"]]
    metadata: dict[str, Any] = {"report": dg.MetadataValue.md(f"```\n{text}\n```"), "n_failed": len(failed),
                                "checks": dg.MetadataValue.json(json_safe(report["checks"])),
                                "path": dg.MetadataValue.path(str(path)), "config_hash": report["config_hash"]}
    for c in report["checks"]:
        if c["drift"] is not None and math.isfinite(c["drift"]):
            metadata[f"drift/{c['name']}"] = float(c["drift"])
    if run.autoscaling is not None:
        metadata.update(autoscaling_metadata(run.autoscaling, report.get("autoscaling_plot")))
    return dg.AssetCheckResult(
        passed=not failed, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
        description=("drifted from production: " + "; ".join(report["failures"]) if failed else
                     f"the replay matches production on {sum(1 for c in report['checks'] if not c.get('skipped'))} "
                     "properties (cached tokens, concurrency, arrivals, token lengths)"))


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json", "markdown"}, automation_condition=EAGER,
          deps=[confirmed_baseline, noise_baseline, POOL, ENGINE], pool=GPU_POOL)
def diagnostic_report(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                      settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource,
                      memory: MemoryStore, campaign: CampaignResource) -> dg.MaterializeResult:
    """Why the working baseline breaks where it does: findings from the workload, its load curve, engine
    metrics, the GPU profile and probes, each with evidence, and ranked bottleneck hypotheses mapped to
    research directions and knobs (what the orchestrator and the proposers read)."""
    r = runner(context, registry, engines, settings, store, lake, memory, campaign)
    report = r.diagnose()
    era = r.state.era
    top = [{k: h.get(k) for k in ("bottleneck", "direction", "score", "knobs")} for h in report.get("hypotheses", [])[:3]]
    md_path = r._era_dir() / "diagnosis" / "report.md"
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.md(md_path.read_text() if md_path.exists() else "campaign ended: no diagnosis"),
        "top_hypotheses": dg.MetadataValue.json(json_safe(top)),
        "top_bottleneck": top[0]["bottleneck"] if top else "", "top_score": float(top[0]["score"]) if top else 0.0,
        "n_findings": len(report.get("findings") or []), "era": era.index,
        "path": dg.MetadataValue.path(str(era.report_path or ""))})


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json"}, automation_condition=EAGER,
          deps=[diagnostic_report, confirmed_baseline, noise_baseline])
def proposals(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
              settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource, memory: MemoryStore,
              campaign: CampaignResource) -> dg.MaterializeResult:
    """This round's plan: the orchestrator's research directions, one proposer session per direction (in
    parallel), every four-part proposal (explanation, intervention, numeric prediction with an interval,
    falsification) through the guardrails, and the experiments chosen within the budget. Rerun for the
    next round by the campaign sensor while the baseline stays the same."""
    r = runner(context, registry, engines, settings, store, lake, memory, campaign)
    plan = r.plan()
    if plan is None:
        return dg.MaterializeResult(metadata={"dagster/row_count": 0, "campaign_ended": not r.running,
                                              "reason": str(r.state.ended_because or
                                                            "the engine version changed: a fresh baseline first")})
    rows = [{"id": p.id, "proposer": p.proposer, "direction": p.direction, "kind": p.kind,
             "intervention": f"`{json.dumps(p.intervention.delta(), default=str)}`",
             "predicted": f"{p.prediction.capacity_ratio:.3f} [{p.prediction.ratio_low:.3f}, {p.prediction.ratio_high:.3f}]",
             "falsification": p.falsification[:160], "trace": p.trace or ""} for p in plan.proposals]
    refused = [{"id": x["proposal_id"], "reasons": "; ".join(x["reasons"])[:200]} for x in plan.rejected]
    md = (f"Round {plan.round}: directions {', '.join(d['direction'] for d in plan.directions)}.\n\n"
          + _table(rows, ["id", "proposer", "direction", "kind", "intervention", "predicted", "falsification", "trace"])
          + ("\n\nRefused:\n\n" + _table(refused, ["id", "reasons"]) if refused else ""))
    return dg.MaterializeResult(metadata={
        "dagster/row_count": len(plan.proposals), "round": plan.round, "proposals": dg.MetadataValue.md(md),
        "directions": dg.MetadataValue.json(json_safe(plan.directions)),
        "sessions": dg.MetadataValue.json(json_safe(plan.sessions)),
        "path": dg.MetadataValue.path(str(r.state.rounds[-1]["plan"]))})


@dg.op(ins={"start": dg.In(dg.Nothing)}, out=dg.DynamicOut(str))
def round_experiments(context: dg.OpExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                      settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource,
                      memory: MemoryStore, campaign: CampaignResource):
    """One dynamic output per experiment of the planned round."""
    r = runner(context, registry, engines, settings, store, lake, memory, campaign)
    plan = r.current_plan()
    for p in (plan.proposals if plan else []):
        yield dg.DynamicOutput(p.id, mapping_key=p.id.replace("-", "_").replace(".", "_").replace(":", "_")
                               .replace("=", "_").replace("+", "_"))


@dg.op(pool=GPU_POOL, retry_policy=dg.RetryPolicy(max_retries=1))
def run_experiment_step(context: dg.OpExecutionContext, proposal_id: str, registry: EndpointRegistry,
                        engines: EngineFactory, settings: MeasurementSettings, store: ArtifactStore,
                        lake: ResultsLakeResource, memory: MemoryStore, campaign: CampaignResource) -> dict:
    """One experiment through the shared harness (a GPU slot of the ``gpu`` pool while it runs)."""
    r = runner(context, registry, engines, settings, store, lake, memory, campaign)
    plan = r.current_plan()
    proposal = next(p for p in plan.proposals if p.id == proposal_id)
    return r.run_proposal(plan, proposal)


@dg.op
def collect_round(context: dg.OpExecutionContext, records: list[dict], store: ArtifactStore) -> list[dict]:
    """The round's verdicts, in plan order, written beside the plan."""
    name = context.partition_key
    order = {r["proposal_id"]: i for i, r in enumerate(records)}
    records = sorted(records, key=lambda r: (r.get("round", 0), order[r["proposal_id"]]))
    store.write_json(name, "experiment_results", "verdicts.json", json_safe(records))
    if records:
        plot = plot_ratios([{"candidate_id": r["proposal_id"], "ratio_median": r.get("ratio_median"),
                             "ci_low": r.get("ci_low"), "ci_high": r.get("ci_high"), "verdict": r["verdict"]}
                            for r in records], store.dir(name, "experiment_results") / "ratios.png",
                           title=f"{name}: candidates vs the working baseline")
        context.add_output_metadata({"plot": dg.MetadataValue.md(png_markdown(plot, "capacity ratios"))})
    context.add_output_metadata({
        "dagster/row_count": len(records),
        "verdicts": dg.MetadataValue.md(_table([{
            "proposal": r["proposal_id"], "intervention": f"`{json.dumps(r['intervention'], default=str)}`",
            "predicted": f"{r['prediction']['capacity_ratio']:.3f}", "verdict": r["verdict"],
            "ratio": f"{r['ratio_median']:.3f}" if r.get("ratio_median") else "-",
            "GPU-h": f"{(r.get('gpu_seconds') or 0) / 3600:.2f}", "reason": (r.get("reason") or "")[:120]}
            for r in records], ["proposal", "intervention", "predicted", "verdict", "ratio", "GPU-h", "reason"])),
        "gpu_hours": float(sum((r.get("gpu_seconds") or 0) for r in records) / 3600)})
    return records


@dg.graph_asset(partitions_def=endpoints, group_name=LOOP, kinds={"parquet", "json"}, automation_condition=EAGER,
                ins={"proposals": dg.AssetIn(dagster_type=dg.Nothing)})
def experiment_results(proposals) -> list[dict]:
    """The round's experiments, one step each (a dynamic fan-out over the plan): interleaved fresh runs of
    the candidate with anchors of the baseline, against the baseline's shared control, to a verdict
    (better | same | worse | invalid) with its evidence. A lossy candidate passes the correctness gate
    first; one that fails it is a verdict (invalid: correctness) and the round goes on."""
    return collect_round(round_experiments(start=proposals).map(run_experiment_step).collect())


@dg.asset_check(asset=experiment_results, blocking=True, partitions_def=endpoints,
                description="No lossy candidate can be promoted without passing the output-distribution gate "
                            "(top-1 agreement, KL, TV vs the baseline); lists the candidates the gate stopped.")
def correctness_gate(context: dg.AssetCheckExecutionContext, store: ArtifactStore) -> dg.AssetCheckResult:
    records = store.read_json(context.partition_key, "experiment_results", "verdicts.json")
    gated = [r for r in records if r.get("lossy")]
    stopped = [r["proposal_id"] for r in gated if r.get("correctness") and not r["correctness"].get("passed")]
    unsafe = [r["proposal_id"] for r in gated if r["verdict"] == "better"
              and not (r.get("correctness") or {}).get("passed")]
    return dg.AssetCheckResult(
        passed=not unsafe, severity=dg.AssetCheckSeverity.ERROR,
        description=(f"promotable without a passing gate: {', '.join(unsafe)}" if unsafe else
                     f"{len(gated)} lossy candidate(s) gated; stopped by the gate (invalid: correctness): "
                     f"{', '.join(stopped) or 'none'}"),
        metadata={"gated": len(gated), "stopped": dg.MetadataValue.json(stopped),
                  "details": dg.MetadataValue.json(json_safe([{"proposal_id": r["proposal_id"], **(r.get("correctness")
                                                                                                     or {})}
                                                               for r in gated]))})


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json"}, automation_condition=EAGER,
          deps=[experiment_results], pool=GPU_POOL)  # a multi-knob candidate's ablation runs before it is promoted
def promotion_decision(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                       settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource,
                       memory: MemoryStore, campaign: CampaignResource) -> dg.MaterializeResult:
    """The round closed: predictions scored against outcomes, memory written, and the decision: promote
    the "better" candidate with the highest CI lower bound (the promotion sensor makes it the new
    baseline), run another round on the same baseline (the campaign sensor), or end the campaign."""
    r = runner(context, registry, engines, settings, store, lake, memory, campaign)
    plan = r.current_plan()
    records = store.read_json(r.endpoint.name, "experiment_results", "verdicts.json") if plan else []
    records = [x for x in records if plan and x.get("round") == plan.round]
    decision = r.close(plan, records)
    path = store.write_json(r.endpoint.name, "promotion_decision", "decision.json", json_safe(decision))
    context.log.info(decision.get("reason", ""))
    scores = [e.get("score") or {} for e in r.state.experiments if e.get("round") == decision["round"]]
    hits = [s["direction_hit"] for s in scores if s.get("scored")]
    emu = sorted(abs(e["emulator_prediction"]["log_error"]) for e in r.state.experiments
                 if (e.get("emulator_prediction") or {}).get("log_error") is not None)
    return dg.MaterializeResult(metadata={
        "promote": bool(decision["promote"]), "next": decision["next"],
        "ended_because": str(decision.get("ended_because") or ""),
        "candidate_id": decision.get("proposal_id") or "", "experiment_id": decision.get("experiment_id") or "",
        "server_config_json": json.dumps(decision.get("config") or {}, sort_keys=True),
        "ratio": float(decision["ratio"]) if decision.get("ratio") is not None else 0.0,
        "reason": decision.get("reason", ""), "round": int(decision["round"]),
        "round_hit_rate": float(sum(hits) / len(hits)) if hits else 0.0,
        "experiments_spent": int(r.state.spent["experiments"]),
        "gpu_hours_spent": float(r.state.spent["gpu_seconds"] / 3600),
        # the calibrated emulator's error over this campaign's verified experiments (emulator_error_report has more)
        "emulator_median_abs_log_error": float(emu[len(emu) // 2]) if emu else 0.0,
        "emulator_calibration_version": int(r.state.surrogate.get("version") or 0),
        "path": dg.MetadataValue.path(str(path))})


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json", "markdown"}, deps=[promotion_decision])
def campaign_report(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                    settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource,
                    memory: MemoryStore, campaign: CampaignResource) -> dg.MaterializeResult:
    """The campaign's result: the best confirmed config, its gain over the original baseline with the CI
    (requests/s/GPU at the SLA), lossless or lossy, correctness, every experiment with its prediction
    and verdict, prediction hit rates per proposer and direction, open questions, and the review
    package a person approves or rejects (job ``approve_production``). Requested by the campaign
    sensor when the campaign ends."""
    from autoresearch_dagster.campaign.report import format_report

    r = runner(context, registry, engines, settings, store, lake, memory, campaign)
    report = r.finish()
    lake.lake().refresh_views()
    by = report["scores_by_proposer"] + report["scores_by_direction"]
    md = (f"```\n{format_report(report)}\n```\n\n**Prediction scores**\n\n"
          + _table([{**x, "hit_rate": f"{x['hit_rate']:.0%}", "coverage": f"{x['coverage']:.0%}",
                     "median_abs_log_error": f"{x['median_abs_log_error']:.3f}"} for x in by],
                   ["proposer", "direction", "n", "hit_rate", "coverage", "median_abs_log_error"])
          + ("\n\n" + png_markdown(report["paths"]["plot"], "campaign progress") if report["paths"].get("plot") else ""))
    ci = report.get("gain_ci") or [0.0, 0.0]
    return dg.MaterializeResult(metadata={
        "gain": float(report["gain"] or 0.0), "gain_ci_low": float(ci[0] or 0.0), "gain_ci_high": float(ci[1] or 0.0),
        "final_rps_per_gpu": float(report["final_rps_per_gpu"] or 0.0), "lossy": bool(report["lossy"]),
        "ended_because": str(report["ended_because"]), "experiments": len(report["experiments"]),
        "hit_rate": float(report["hit_rate"] or 0.0), "report": dg.MetadataValue.md(md),
        "best_config": dg.MetadataValue.json(json_safe(report["best_config"])),
        "review": dg.MetadataValue.path(report["paths"]["review"]),
        "campaign_json": dg.MetadataValue.path(report["paths"]["campaign_json"])})
