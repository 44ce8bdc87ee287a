"""Owns GPUs saved under the real demand curve: an autoscaled endpoint's GPU-seconds on a candidate config against
the baseline's when both replay the same production demand, over repeated runs.

Each run's demand replay (``RunRecord.autoscaling``, see ``experiments.runs``: the pool's production shape at
the demand speed-up, 1 = the demand as logged) reports the GPU-seconds its fleet held. ``savings`` compares the
arms' run-level values as verdicts compare capacities: median(candidate) / median(baseline) with the verdicts'
bootstrap interval (``stats.median_ratio_interval``, 90% two-sided; none with fewer than two runs an arm), and
the mean GPUs held per arm (each replay's GPU-seconds over its window, averaged over runs) differenced. A ratio
below 1, and GPUs saved above 0, mean the candidate serves the same demand on fewer GPUs: a capacity gain shown
as GPUs.

``measure_savings`` is what a campaign runs at its end when its experiments measured capacity only: the best
config and the original replay the demand curve ``runs`` times each (interleaved pairs sharing a seed, fresh
deployments through ``execute_run`` in mode ``demand``), each run recorded in the lake like any other (``runs``,
``autoscaling``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from autoresearch_dagster.experiments import stats
from autoresearch_dagster.experiments.parallel import RunTask, run_many
from autoresearch_dagster.experiments.runs import HarnessSettings, Progress, RunRecord, record_run
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.spec import EndpointSpec, config_hash

PURPOSE = "gpu_savings"
LABEL = "GPUs saved under the real demand curve"


def _arm(reports: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    rs = [r for r in reports if r and r.get("gpu_seconds") is not None]
    burst = sum(r.get("burst_requests") or 0 for r in rs)
    lat = [r["scale_up_latency_median_s"] for r in rs if r.get("scale_up_latency_median_s") is not None]
    return {"n": len(rs), "gpu_seconds": [float(r["gpu_seconds"]) for r in rs],
            "mean_gpus": [float(r["gpu_seconds"]) / float(r["window_s"]) for r in rs if r.get("window_s")],
            "burst_miss_rate": (sum(r.get("burst_sla_misses") or 0 for r in rs) / burst) if burst else None,
            "scale_up_latency_median_s": float(np.median(lat)) if lat else None}


def savings(baseline: Sequence[dict[str, Any] | None], candidate: Sequence[dict[str, Any] | None], *,
            seed: int = 0) -> dict[str, Any] | None:
    """The comparison (module docstring) of two arms' autoscaling reports; None when an arm has none."""
    b, c = _arm(baseline), _arm(candidate)
    if not b["n"] or not c["n"] or float(np.median(b["gpu_seconds"])) <= 0:
        return None
    lo = hi = method = None
    if b["n"] >= 2 and c["n"] >= 2:
        ratio, lo, hi, method = stats.median_ratio_interval(b["gpu_seconds"], c["gpu_seconds"], seed=seed)
    else:
        ratio = float(np.median(c["gpu_seconds"]) / np.median(b["gpu_seconds"]))
    mb = float(np.mean(b["mean_gpus"])) if b["mean_gpus"] else None
    mc = float(np.mean(c["mean_gpus"])) if c["mean_gpus"] else None
    return {"label": LABEL, "runs_baseline": b["n"], "runs_candidate": c["n"],
            "gpu_seconds_baseline": float(np.median(b["gpu_seconds"])),
            "gpu_seconds_candidate": float(np.median(c["gpu_seconds"])),
            "gpu_seconds_ratio": ratio, "ci_low": lo, "ci_high": hi,
            "confidence": stats.DECISION_CONFIDENCE if method else None, "ci_method": method,
            "mean_gpus_baseline": mb, "mean_gpus_candidate": mc,
            "mean_gpus_saved": None if mb is None or mc is None else mb - mc,
            "burst_miss_rate_baseline": b["burst_miss_rate"], "burst_miss_rate_candidate": c["burst_miss_rate"],
            "scale_up_latency_median_s_baseline": b["scale_up_latency_median_s"],
            "scale_up_latency_median_s_candidate": c["scale_up_latency_median_s"]}


def from_runs(runs: Sequence[RunRecord], *, seed: int = 0,
              purposes: tuple[str, ...] = ("experiment", "confirmation", PURPOSE)) -> dict[str, Any] | None:
    """``savings`` over the valid runs of both arms that replayed the demand curve, with the speed-up replayed."""
    pick = [r for r in runs if r.valid and r.purpose in purposes and r.autoscaling is not None]
    out = savings([r.autoscaling for r in pick if r.arm == "baseline"],
                  [r.autoscaling for r in pick if r.arm == "candidate"], seed=seed)
    if out is not None:
        out["demand_speedup"] = next((r.demand_speedup for r in pick), None)
        out["run_ids"] = [r.run_id for r in pick]
    return out


def measure_savings(endpoint: EndpointSpec, baseline_config: dict[str, Any], candidate_config: dict[str, Any],
                    pool: Any, *, engine: Any, runs: int, settings: HarnessSettings | None = None,
                    results: Any = None, campaign_id: str | None = None, experiment_id: str | None = None,
                    progress: Progress = None) -> dict[str, Any] | None:
    """``runs`` demand replays per config (ABAB, seeds of their own) and their ``savings``; None when the
    endpoint does not autoscale or no run of an arm was valid."""
    if endpoint.autoscaling is None or runs < 1:
        return None
    settings = settings or HarnessSettings(capacity=CapacitySettings())
    # a pair of runs shares its seed: both configs get the same draw of arrival times inside each interval
    tasks = [RunTask(config=dict(cfg), arm=arm, run_index=2 * k + j, seed=settings.seed * 1_000_003 + 700_000 + k,
                     purpose=PURPOSE, mode="demand")
             for k in range(runs)
             for j, (arm, cfg) in enumerate((("baseline", baseline_config), ("candidate", candidate_config)))]
    recs: list[RunRecord] = []

    def stored(rec: RunRecord) -> None:
        recs.append(rec)
        record_run(results, endpoint.name, rec, experiment_id=experiment_id, campaign_id=campaign_id,
                   gpus=endpoint.gpus)
        if progress:
            a = rec.autoscaling or {}
            progress(f"  demand replay {rec.arm} {rec.config_hash}: "
                     + (f"{a['gpu_seconds']:.0f} GPU-seconds" if a else "INVALID: " + "; ".join(rec.invalid_reasons)))

    run_many(endpoint, pool, tasks, engine=engine, settings=settings, workers=settings.parallel_runs, on_done=stored)
    out = from_runs(recs, seed=settings.seed, purposes=(PURPOSE,))
    if out is not None:
        out.update({"baseline_hash": config_hash(baseline_config), "candidate_hash": config_hash(candidate_config),
                    "gpu_seconds_spent": float(sum(r.gpu_seconds for r in recs))})
    return out


def format_line(s: dict[str, Any] | None) -> str:
    """One line: the GPU-seconds ratio with its interval and the mean GPUs saved."""
    if not s or s.get("mean_gpus_saved") is None:
        return "not measured"
    ci = (f" (90% CI {s['ci_low']:.3f}-{s['ci_high']:.3f})" if s.get("ci_low") is not None else
          " (one run an arm: no interval)")
    return (f"{s['mean_gpus_saved']:.2f} GPUs on average ({s['mean_gpus_baseline']:.2f} -> "
            f"{s['mean_gpus_candidate']:.2f}); GPU-seconds x{s['gpu_seconds_ratio']:.3f}{ci} over "
            f"{s['runs_baseline']}+{s['runs_candidate']} replays at x{s.get('demand_speedup') or 1:g} demand")
