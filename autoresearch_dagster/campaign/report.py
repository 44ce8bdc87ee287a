"""Owns a campaign's final report: ``campaign.json``, the results table, the progress plot and the lake row.

The best confirmed config is the era (working baseline) with the highest measured capacity among
the original and the promotions whose gain replicated when their noise floor was re-measured. The
gain over the original baseline is the ratio of the two eras' median capacities (independent noise
floors, requests/s/GPU at the SLA) with a bootstrap interval at the verdicts' confidence. On an
autoscaled endpoint the gain is also shown as GPUs saved under the real demand curve: the best config's
GPU-seconds against the original's when both replay the production demand (``CampaignRunner.gpu_savings``).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from autoresearch_dagster.agents import scoring
from autoresearch_dagster.campaign.state import same_version
from autoresearch_dagster.experiments import stats
from autoresearch_dagster.experiments.gpu_savings import LABEL, format_line
from autoresearch_dagster.outputs.files import json_safe, write_json
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import is_lossy


def confirmed_eras(state: Any) -> list[Any]:
    """Eras whose capacity was measured and, for promotions, replicated (an engine_bump era re-measured its
    config on the new engine version)."""
    return [e for e in state.eras if e.noise and (e.index == 0 or e.reason == "engine_bump"
                                                  or (e.replication or {}).get("replicated"))]


def best_era(state: Any) -> Any:
    """The confirmed era of highest capacity among those of the latest measured engine version (capacities of
    two engine versions are not compared)."""
    eras = confirmed_eras(state)
    if eras:
        version = eras[-1].engine_version
        eras = [e for e in eras if same_version(e.engine_version, version)]
    return max(eras, key=lambda e: e.noise["median"]) if eras else state.eras[0]


def reference_era(state: Any, best: Any) -> Any:
    """What the gain is measured against: the original, or after an engine bump the first measured era of the
    best era's engine version (the working config re-measured on it)."""
    if same_version(state.original.engine_version, best.engine_version):
        return state.original
    return next((e for e in state.eras if e.noise and same_version(e.engine_version, best.engine_version)), best)


def per_gpu(era: Any, gpus: int) -> float:
    """An era's median capacity per GPU: over one server's GPUs, or over the GPUs an autoscaled fleet held at
    capacity (``gpus_held``, measure.capacity)."""
    noise = era.noise or {}
    return (noise.get("median") or 0) / (noise.get("gpus_held") or gpus)


def open_questions(state: Any, memory: Any, profile: dict[str, Any]) -> list[str]:
    out = list(dict.fromkeys(state.open_questions))
    tried = {e["direction"] for e in state.experiments if e.get("ran")}
    for d in ("scheduling_cache", "speculative", "kernels_quant", "parallel_admission"):
        if d not in tried:
            out.append(f"direction {d} was never tested in this campaign")
    for e in state.experiments:
        if e["verdict"] == "same" and "underpowered" in (e.get("reason") or ""):
            out.append(f"{e['proposal_id']} ({json.dumps(e['intervention'], default=str)}) stopped undecided at "
                       f"{e.get('ratio_median') or 0:.3f}x: more runs could tell")
        if e["verdict"] == "invalid" and not e.get("ran"):
            out.append(f"{e['proposal_id']}: {e['reason']}")
    for era in state.eras[1:]:
        if era.replication and not era.replication.get("replicated"):
            out.append(f"promotion of {era.source_experiment_id} did not replicate on fresh runs "
                       f"({era.replication['ratio']:.3f}x)")
        elif era.noise is None:
            out.append(f"promotion of {era.source_experiment_id} was never re-measured (the campaign ended first)")
    if memory is not None:
        for row in memory.similar(profile, k=20):
            if row["disagreement"]:
                cases = "; ".join(f"{c['endpoint']}: {c['outcome']} ({(c.get('ratio') or 0):.3f}x)" for c in row["cases"])
                out.append(f"memory disagrees on {row['technique']}: {cases}")
    return list(dict.fromkeys(out))


def plot_progress(state: Any, path: Path) -> Path | None:
    """Capacity of each working baseline and every experiment's candidate, in the order they ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"better": "tab:green", "same": "tab:gray", "worse": "tab:red", "invalid": "black"}
    fig, ax = plt.subplots(figsize=(8, 4))
    x, base_x, base_y = 0, [], []
    era_cap = {e.index: (e.noise or {}).get("median") for e in state.eras}
    for i, e in enumerate(state.experiments):
        cap = era_cap.get(e.get("era"))
        if cap:
            base_x.append(i)
            base_y.append(cap)
            if e.get("ratio_median"):
                ax.scatter(i, cap * e["ratio_median"], color=colors.get(e["verdict"], "black"), zorder=3,
                           label=e["verdict"])
            elif e["verdict"] == "invalid":
                ax.scatter(i, cap, marker="x", color="black", zorder=3, label="invalid")
        x = i
    if base_x:
        ax.step(base_x, base_y, where="post", color="tab:blue", label="working baseline")
    orig = era_cap.get(0)
    if orig:
        ax.axhline(orig, color="tab:blue", ls=":", lw=1, label="original baseline")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="upper left")
    ax.set_xlabel("experiment (in order)")
    ax.set_ylabel("capacity at the SLA (req/s)")
    ax.set_title(f"{state.endpoint}: campaign progress ({len(state.experiments)} experiments)")
    ax.set_xlim(-0.5, max(x, 1) + 0.5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_report(runner: Any) -> dict[str, Any]:
    """Write campaign.json, the plot, the review package and the lake row; return the report."""
    from autoresearch_dagster.campaign.review import write_review_package

    st = runner.state
    gpus = runner.endpoint.gpus
    best = best_era(st)
    orig = reference_era(st, best)
    gain = gain_ci = None
    if orig.noise and best.noise:
        if best.index == orig.index:
            gain, gain_ci = 1.0, [1.0, 1.0]
        else:
            v = stats.verdict(orig.noise["capacities"], best.noise["capacities"], noise_cv=float(orig.noise["cv"]),
                              seed=runner.settings.seed)
            gain, gain_ci = v.ratio_median, [v.ci_low, v.ci_high]
    scored = [{**e["score"], "proposer": e["proposer"], "direction": e["direction"]} for e in st.experiments
              if e.get("score")]
    overall = scoring.aggregate(scored, by=())
    hit = overall[0] if overall else {"hit_rate": None, "coverage": None, "n": 0}
    experiments = [{"id": e["experiment_id"], "proposal_id": e["proposal_id"], "source": e["proposer"],
                    "origin": e.get("source"), "kind": e["kind"], "direction": e["direction"], "round": e["round"],
                    "era": e["era"], "intervention": e["intervention"], "prediction": e["prediction"],
                    "verdict": e["verdict"], "confirmed": e.get("confirmed"), "ratio_median": e.get("ratio_median"),
                    "ci": [e.get("ci_low"), e.get("ci_high")], "lossy": e.get("lossy"),
                    "correctness_passed": (e.get("correctness") or {}).get("passed") if e.get("correctness") else None,
                    "gpu_hours": (e.get("gpu_seconds") or 0) / 3600, "runs": e.get("runs"), "score": e.get("score"),
                    "trace": e.get("trace"), "reason": e.get("reason"),
                    "emulator_prediction": e.get("emulator_prediction"), "gpu_savings": e.get("gpu_savings")}
                   for e in st.experiments]
    path_exps = [e for e in st.experiments if e["experiment_id"] in {x.source_experiment_id for x in st.eras[1:best.index + 1]}]
    correctness = [{"experiment_id": e["experiment_id"], "intervention": e["intervention"], **(e.get("correctness") or {})}
                   for e in path_exps if e.get("correctness")]
    decided = [e for e in st.experiments if e.get("ran") and e["verdict"] in ("better", "same", "worse")]
    gpu_per_verdict = sorted((e.get("gpu_seconds") or 0) / 3600 for e in decided)
    report = {
        "campaign_id": st.campaign_id, "endpoint": st.endpoint, "sla": st.sla, "gpus": gpus,
        "original_config": st.original.config, "reference_era": orig.index,
        "original_capacity_rps": (orig.noise or {}).get("median"),
        "original_rps_per_gpu": per_gpu(orig, gpus),
        "final_capacity_rps": (best.noise or {}).get("median"), "final_rps_per_gpu": per_gpu(best, gpus),
        "gain": gain, "gain_ci": gain_ci, "gain_confidence": stats.DECISION_CONFIDENCE,
        "gpu_savings": runner.gpu_savings(),
        "best_config": best.config, "best_config_hash": best.config_hash, "best_era": best.index,
        "lossy": is_lossy(best.config, st.original.config, runner.endpoint.engine), "correctness": correctness,
        "experiments": experiments,
        "by_verdict": dict(Counter(e["verdict"] for e in st.experiments)),
        "by_source": dict(Counter(f"{e['proposer']}/{e['kind']}" for e in st.experiments)),
        "hit_rate": hit.get("hit_rate"), "coverage": hit.get("coverage"), "scored": hit.get("n", 0),
        "scores_by_proposer": scoring.aggregate(scored, by=("proposer",)),
        "scores_by_direction": scoring.aggregate(scored, by=("direction",)),
        "eras": [{"index": e.index, "config_hash": e.config_hash, "reason": e.reason,
                  "source_experiment_id": e.source_experiment_id, "delta": e.delta,
                  "capacity_rps": (e.noise or {}).get("median"), "cv": (e.noise or {}).get("cv"),
                  "replication": e.replication, "engine_version": e.engine_version, "ablation": e.ablation}
                 for e in st.eras],
        "engine_version": st.era.engine_version, "previous_campaign": st.previous,
        "promotion_attribution": (st.last_promotion or {}).get("attribution"),
        "open_questions": open_questions(st, runner.memory, runner.profile_for_memory()),
        "ended_because": st.ended_because, "rounds": len(st.rounds),
        "memory": {"root": str(runner.memory.root) if runner.memory else None, "problems": list(st.memory_problems)},
        "spent": {"experiments": int(st.spent["experiments"]), "gpu_hours": st.spent["gpu_seconds"] / 3600,
                  "wall_s": st.spent.get("wall_s", 0.0)},
        "gpu_hours_per_decided_verdict_median": gpu_per_verdict[len(gpu_per_verdict) // 2] if gpu_per_verdict else None,
        "surrogate": st.surrogate.get("calibration"),
        "calibration": {k: st.surrogate.get(k) for k in ("start_version", "version", "recalibrations", "profile")},
        "paths": {"dir": str(runner.dir), "state": str(runner.state_path)},
        "finished_at": utc_now().isoformat(),
    }
    plot = plot_progress(st, runner.dir / "campaign_progress.png")
    report["paths"]["plot"] = str(plot) if plot else None
    review = write_review_package(report, st, runner.endpoint, runner.dir / "review")
    report["paths"]["review"] = str(review)
    report["paths"]["campaign_json"] = str(runner.dir / "campaign.json")
    write_json(runner.dir / "campaign.json", json_safe(report), sort_keys=False)
    if runner.results is not None:
        runner.results.append_rows({"campaign_results": [{
            "campaign_id": st.campaign_id, "ended_because": st.ended_because,
            "original_capacity_rps": report["original_capacity_rps"], "final_capacity_rps": report["final_capacity_rps"],
            "original_rps_per_gpu": report["original_rps_per_gpu"], "final_rps_per_gpu": report["final_rps_per_gpu"],
            "gain": gain, "gain_ci_low": gain_ci[0] if gain_ci else None, "gain_ci_high": gain_ci[1] if gain_ci else None,
            "lossy": report["lossy"], "experiments": len(st.experiments), "gpu_hours": report["spent"]["gpu_hours"],
            "demand_gpu_seconds_ratio": (report["gpu_savings"] or {}).get("gpu_seconds_ratio"),
            "demand_mean_gpus_saved": (report["gpu_savings"] or {}).get("mean_gpus_saved"),
            "hit_rate": report["hit_rate"], "coverage": report["coverage"],
            "best_config_json": json.dumps(best.config, sort_keys=True), "review_path": str(review),
            "finished_at": utc_now()}]}, endpoint=st.endpoint)
    return report


def _f(x: Any, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def format_report(report: dict[str, Any]) -> str:
    """The table a campaign ends with, and where to look."""
    ci = report.get("gain_ci") or [None, None]
    lines = [f"campaign {report['campaign_id']} on {report['endpoint']} ({report['sla']}): "
             f"ended because {report['ended_because']}", "",
             f"{'original capacity':<28} {_f(report['original_capacity_rps'], '.2f')} req/s "
             f"({_f(report['original_rps_per_gpu'], '.2f')} req/s/GPU)",
             f"{'final confirmed capacity':<28} {_f(report['final_capacity_rps'], '.2f')} req/s "
             f"({_f(report['final_rps_per_gpu'], '.2f')} req/s/GPU)",
             f"{'gain (90% CI)':<28} {_f(report['gain'], '.3f')}x [{_f(ci[0], '.3f')}, {_f(ci[1], '.3f')}]"
             f"  {'lossy' if report['lossy'] else 'lossless'}",
             *([f"{LABEL}: {format_line(report['gpu_savings'])}"]
               if report.get("gpu_savings") else []),
             f"{'best config':<28} {json.dumps(report['best_config'], sort_keys=True, default=str)}",
             f"{'experiments by verdict':<28} {json.dumps(report['by_verdict'], sort_keys=True)}",
             f"{'experiments by source':<28} {json.dumps(report['by_source'], sort_keys=True)}",
             f"{'prediction hit rate':<28} {_f(report['hit_rate'], '.0%')} of {report['scored']} scored "
             f"(interval coverage {_f(report['coverage'], '.0%')})",
             f"{'spent':<28} {report['spent']['experiments']} experiments, "
             f"{report['spent']['gpu_hours']:.1f} GPU-hours (median "
             f"{_f(report['gpu_hours_per_decided_verdict_median'], '.2f')} per decided verdict)", "",
             f"{'#':>3} {'proposal':<28} {'source':<14} {'intervention':<44} {'predicted':>9} {'verdict':<8} {'ratio':>7}"]
    for i, e in enumerate(report["experiments"], 1):
        iv = json.dumps(e["intervention"], sort_keys=True, default=str)
        lines.append(f"{i:>3} {e['proposal_id'][:28]:<28} {(e['source'] + '/' + e['kind'])[:14]:<14} {iv[:44]:<44} "
                     f"{_f(e['prediction']['capacity_ratio'], '9.3f')} {e['verdict']:<8} {_f(e['ratio_median'], '7.3f')}")
    if (report.get("memory") or {}).get("problems"):
        lines += ["", f"warning: memory in {report['memory']['root']} not versioned:"] + \
            [f"  - {m}" for m in report["memory"]["problems"][-3:]]
    if report["open_questions"]:
        lines += ["", "open questions:"] + [f"  - {q}" for q in report["open_questions"][:10]]
    p = report["paths"]
    lines += ["", "where to look:", f"  campaign.json:  {p['campaign_json']}", f"  review package: {p['review']}",
              f"  progress plot:  {p.get('plot')}", f"  traces:         {Path(p['dir']) / 'traces'}"]
    return "\n".join(lines)
