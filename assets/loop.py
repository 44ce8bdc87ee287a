"""Owns the loop assets: confirmed_baseline (root), noise_baseline, diagnostic_report, proposals,
experiment_results (+ blocking correctness_gate check) and promotion_decision. Thin: each calls the
core and attaches metadata; files go to the artifact store, rows to the results lake."""
import json
from datetime import datetime
from typing import Any

import dagster as dg

from assets.config import PROMOTED_FROM_TAG, BaselineConfig
from assets.metadata import png_markdown
from assets.partitions import EAGER, endpoints
from autoresearch_dagster.outputs.files import json_safe
from autoresearch_dagster.outputs.plots import plot_load_curve, plot_ratios
from autoresearch_dagster.results import utc_now
from resources import (
    ArtifactStore,
    EndpointRegistry,
    EngineFactory,
    MeasurementSettings,
    MemoryStore,
    ResultsLakeResource,
)

LOOP = "loop"
POOL = dg.AssetKey("replay_pool")
ENGINE = dg.AssetKey("engine_version")


def _pool(lake: ResultsLakeResource, name: str) -> Any:
    from autoresearch_dagster.pool.schema import read_pool

    return read_pool(lake.lake().pool_dir(name))


def _campaign(spec: Any, pool: Any, lake: Any) -> Any:
    """The campaign of (endpoint, pool, SLA): reused while they stay the same, recorded when new."""
    from autoresearch_dagster.experiments.campaign import start_campaign

    return start_campaign(spec, pool, results=lake)


def _baseline(store: ArtifactStore, name: str) -> dict[str, Any]:
    return store.read_json(name, "confirmed_baseline", "baseline.json")


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json"})
def confirmed_baseline(context: dg.AssetExecutionContext, config: BaselineConfig, registry: EndpointRegistry,
                       store: ArtifactStore, lake: ResultsLakeResource) -> dg.MaterializeResult:
    """The working baseline server config of the endpoint. A root asset: seeded from the endpoint
    spec by the discovery sensor and re-materialized with a candidate's config by the promotion
    sensor (the loop's back edge). The spec's own config stays the campaign's original reference."""
    from autoresearch_dagster.experiments.campaign import record_promotion
    from autoresearch_dagster.spec import config_hash, validate_server_config

    name = context.partition_key
    spec = registry.load(name)
    server_config = (validate_server_config(json.loads(config.server_config_json))
                     if config.server_config_json else dict(spec.server_config))
    source_run = context.run.tags.get(PROMOTED_FROM_TAG)
    if source_run:
        results = lake.lake()
        record_promotion(results, _campaign(spec, _pool(lake, name), results), server_config,
                         experiment_id=config.experiment_id or None)
    record = {"endpoint": name, "candidate_id": config.candidate_id, "server_config": server_config,
              "config_hash": config_hash(server_config), "original_config": dict(spec.server_config),
              "original_config_hash": config_hash(spec.server_config), "promoted_from_run": source_run,
              "experiment_id": config.experiment_id or None, "run_id": context.run.run_id,
              "set_at": utc_now().isoformat()}
    path = store.write_json(name, "confirmed_baseline", "baseline.json", record)
    store.write_json(name, "confirmed_baseline", f"history/{context.run.run_id}.json", record)
    metadata: dict[str, Any] = {
        "candidate_id": config.candidate_id,
        "config_hash": record["config_hash"],
        "server_config": dg.MetadataValue.json(json_safe(server_config)),
        "is_original": record["config_hash"] == record["original_config_hash"],
        "path": dg.MetadataValue.path(str(path)),
    }
    if source_run and not source_run.startswith("runless-"):
        metadata["promoted_from"] = dg.MetadataValue.dagster_run(source_run)
    return dg.MaterializeResult(data_version=dg.DataVersion(record["config_hash"]), metadata=metadata)


def _median_run(runs: list[dict[str, Any]], median: float) -> dict[str, Any] | None:
    valid = [r for r in runs if r.get("valid") and r.get("capacity_rps") is not None]
    return min(valid, key=lambda r: abs(r["capacity_rps"] - median)) if valid else None


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"parquet", "json"}, automation_condition=EAGER,
          deps=[confirmed_baseline, POOL, ENGINE])
def noise_baseline(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                   settings: MeasurementSettings, store: ArtifactStore,
                   lake: ResultsLakeResource) -> dg.MaterializeResult:
    """The endpoint's noise floor: repeated independent capacity searches of the working baseline
    on the replay pool (fresh deployment per run) → capacity CV and the bootstrap CI of the median,
    plus the baseline's load curve. Re-measured when the baseline, the pool or the engine changes."""
    from autoresearch_dagster.experiments.noise import measure_noise

    name = context.partition_key
    spec = registry.load(name)
    baseline = _baseline(store, name)
    pool, results = _pool(lake, name), lake.lake()
    result = measure_noise(spec, baseline["server_config"], pool, engine=engines.make(spec),
                           runs=settings.noise_runs, results=results, settings=settings.harness(),
                           campaign=_campaign(spec, pool, results), progress=context.log.info)
    data = json_safe(result.to_dict())
    path = store.write_json(name, "noise_baseline", "noise.json", data)
    runs = data["run_details"]
    plot = plot_load_curve([(r["steps"], r["capacity_rps"]) for r in runs],
                           store.dir(name, "noise_baseline") / "load_curves.png", sla=spec.sla,
                           band=(data["ci_low"], data["ci_high"]),
                           title=f"{name}: baseline load curves ({data['runs']} runs)")
    md = (f"**{name}** baseline `{baseline['config_hash']}`: median capacity {data['median']:.3f} req/s "
          f"(CI {data['ci_low']:.3f}–{data['ci_high']:.3f}), CV {data['capacity_cv']:.2%} over {data['runs']} "
          f"runs, engine {data['engine']} {data['engine_version']}\n\n" + png_markdown(plot, "load curves"))
    return dg.MaterializeResult(
        data_version=dg.DataVersion(data["noise_id"]),
        metadata={
            "capacity_rps": float(data["median"]),
            "capacity_rps_per_gpu": float(data["median"]) / spec.gpus,
            "capacity_cv": float(data["capacity_cv"]),
            "runs": int(data["runs"]),
            "capacities": dg.MetadataValue.json(data["capacities"]),
            "engine_version": str(data["engine_version"]),
            "report": dg.MetadataValue.md(md),
            "path": dg.MetadataValue.path(str(path)),
            "plot": dg.MetadataValue.path(str(plot)),
        })


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json", "markdown"}, automation_condition=EAGER,
          deps=[confirmed_baseline, noise_baseline, POOL, ENGINE])
def diagnostic_report(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                      settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource,
                      memory: MemoryStore) -> dg.MaterializeResult:
    """Why the endpoint breaks where it does: findings from the workload, the baseline's load curve,
    engine metrics, the GPU profile and probes, each with evidence, and a ranked list of bottleneck
    hypotheses mapped to research directions and knobs (report.json is what the proposers read)."""
    from autoresearch_dagster.diagnose import diagnose

    name = context.partition_key
    spec = registry.load(name)
    baseline = _baseline(store, name)
    noise = store.read_json(name, "noise_baseline", "noise.json")
    curve = _median_run(noise["run_details"], noise["median"])  # reuse a measured curve, don't search again
    out_dir = store.dir(name, "diagnostic_report")
    report = diagnose(spec, _pool(lake, name), engine=engines.make(spec), config=baseline["server_config"],
                      out_dir=out_dir, capacity=curve, measurement=settings.measurement_profile(),
                      probes=settings.diagnosis_probes,
                      memory_path=memory.dir() / "probes.jsonl", seed=settings.seed, progress=context.log.info)
    data = json_safe(report.to_json())
    json_path = store.write_json(name, "diagnostic_report", "report.json", data)
    (out_dir / "report.md").write_text(report.to_markdown())
    top = [{k: h.get(k) for k in ("bottleneck", "direction", "score", "knobs")} for h in data["hypotheses"][:3]]
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.md(report.to_markdown(inline_images=True)),
        "top_hypotheses": dg.MetadataValue.json(top),
        "top_bottleneck": top[0]["bottleneck"] if top else "",
        "top_score": float(top[0]["score"]) if top else 0.0,
        "n_findings": len(data["findings"]),
        "path": dg.MetadataValue.path(str(json_path)),
    })


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json"}, automation_condition=EAGER,
          deps=[diagnostic_report, confirmed_baseline, noise_baseline])
def proposals(context: dg.AssetExecutionContext, registry: EndpointRegistry, settings: MeasurementSettings,
              store: ArtifactStore, lake: ResultsLakeResource) -> dg.MaterializeResult:
    """Four-part proposals (explanation, intervention, numeric prediction, falsifier) for this
    round: the endpoint's candidate files, then the knobs of the report's top hypotheses. Configs
    equal to the baseline or already tested against it since it was set (the lake's experiments) are left out."""
    from autoresearch_dagster.agents.proposal import make_proposals
    from autoresearch_dagster.experiments.experiment import already_tested
    from autoresearch_dagster.experiments.stats import decision_margin

    name = context.partition_key
    baseline = _baseline(store, name)
    noise = store.read_json(name, "noise_baseline", "noise.json")
    report = store.read_json(name, "diagnostic_report", "report.json")
    margin = decision_margin(float(noise["capacity_cv"]), settings.budget(), min_margin=settings.harness().min_margin)
    items = make_proposals(name, report, baseline["server_config"], registry.candidates(name), margin=margin,
                           tested=already_tested(lake.lake(), name, baseline["config_hash"],
                                                  since=datetime.fromisoformat(baseline["set_at"])))
    path = store.write_json(name, "proposals", "proposals.json", [p.model_dump() for p in items])
    rows = "\n".join(f"| {p.id} | {p.source} | `{json.dumps(p.intervention)}` | {p.prediction.value:.3f} | "
                     f"{p.explanation} | {p.falsifier} |" for p in items)
    md = ("| id | source | intervention | predicted ratio | explanation | falsifier |\n"
          "|---|---|---|---|---|---|\n" + rows) if items else "no untested proposal for this baseline"
    return dg.MaterializeResult(metadata={
        "dagster/row_count": len(items),
        "proposals": dg.MetadataValue.md(md),
        "margin": margin,
        "path": dg.MetadataValue.path(str(path)),
    })


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"parquet", "json"}, automation_condition=EAGER,
          deps=[proposals, confirmed_baseline, noise_baseline, POOL],
          check_specs=[dg.AssetCheckSpec("correctness_gate", asset="experiment_results", blocking=True,
                                         description="Every lossy candidate kept the model's output "
                                                     "distribution (top-1 agreement, KL, TV vs baseline).")])
def experiment_results(context: dg.AssetExecutionContext, registry: EndpointRegistry, engines: EngineFactory,
                       settings: MeasurementSettings, store: ArtifactStore, lake: ResultsLakeResource):
    """This round's experiments: baseline vs each proposed candidate (up to the round's budget),
    interleaved fresh runs on the replay pool, a verdict (better | same | worse | invalid) with its
    evidence; rows go to the results lake. The correctness gate fails when a lossy candidate did."""
    from autoresearch_dagster.experiments.experiment import run_experiment

    name = context.partition_key
    spec = registry.load(name)
    baseline = _baseline(store, name)
    noise = store.read_json(name, "noise_baseline", "noise.json")
    todo = store.read_json(name, "proposals", "proposals.json")[: settings.experiments_per_round]
    pool, results = _pool(lake, name), lake.lake()
    campaign = _campaign(spec, pool, results)
    verdicts = []
    for proposal in todo:
        context.log.info(f"experiment {proposal['id']}: {proposal['intervention']}")
        result = run_experiment(spec, baseline["server_config"], proposal["candidate_config"], pool,
                                engine=engines.make(spec), results=results, settings=settings.harness(),
                                budget=settings.budget(), noise_cv=float(noise["capacity_cv"]),
                                campaign=campaign, progress=context.log.info)
        proposed = {"candidate_id": proposal["id"], "prediction": proposal["prediction"],
                    "falsifier": proposal["falsifier"]}
        store.write_json(name, "experiment_results", f"experiments/{result.experiment_id}.json",
                         {**json_safe(result.to_dict()), **proposed})
        verdicts.append({**json_safe(result.summary()), **proposed})
    path = store.write_json(name, "experiment_results", "verdicts.json", verdicts)
    metadata: dict[str, Any] = {
        "dagster/row_count": len(verdicts),
        "verdicts": dg.MetadataValue.json([{k: x for k, x in v.items() if k != "stages"} for v in verdicts]),
        "path": dg.MetadataValue.path(str(path)),
    }
    if verdicts:
        plot = plot_ratios(verdicts, store.dir(name, "experiment_results") / "ratios.png",
                           title=f"{name}: candidate vs baseline capacity")
        metadata["ratio"] = float(verdicts[0]["ratio_median"] or 0.0)
        metadata["plot"] = dg.MetadataValue.md(png_markdown(plot, "capacity ratios"))
    yield dg.MaterializeResult(metadata=metadata)

    gated = [v for v in verdicts if v["correctness"] is not None]
    failed = [v["candidate_id"] for v in gated if not v["correctness"].get("passed")]
    yield dg.AssetCheckResult(
        check_name="correctness_gate", passed=not failed, severity=dg.AssetCheckSeverity.ERROR,
        description=(f"failed for {', '.join(failed)}" if failed else
                     f"{len(gated)} lossy candidate(s) gated, all passed" if gated else
                     "no lossy candidate this round: nothing to gate"),
        metadata={"gated": len(gated), "failed": dg.MetadataValue.json(failed),
                  "details": dg.MetadataValue.json([{"candidate_id": v["candidate_id"], **v["correctness"]}
                                                    for v in gated])})


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"json"}, automation_condition=EAGER,
          deps=[experiment_results])
def promotion_decision(context: dg.AssetExecutionContext, store: ArtifactStore) -> dg.MaterializeResult:
    """Whether this round promotes a candidate and which: the confirmed "better" verdict with the
    highest CI lower bound. The promotion sensor turns a positive decision into a new baseline."""
    from autoresearch_dagster.experiments.promotion import decide_promotion

    name = context.partition_key
    decision = decide_promotion(store.read_json(name, "experiment_results", "verdicts.json"))
    path = store.write_json(name, "promotion_decision", "decision.json", decision.to_dict())
    context.log.info(decision.reason)
    return dg.MaterializeResult(metadata={
        "promote": decision.promote,
        "candidate_id": decision.candidate_id or "",
        "experiment_id": str(decision.evidence.get("experiment_id") or ""),
        "server_config_json": json.dumps(decision.server_config or {}, sort_keys=True),
        "ratio": float(decision.ratio_median) if decision.ratio_median is not None else 0.0,
        "reason": decision.reason,
        "evidence": dg.MetadataValue.json(json_safe(decision.evidence)),
        "path": dg.MetadataValue.path(str(path)),
    })
