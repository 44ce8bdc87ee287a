"""Owns the noise floor of a baseline: repeated independent runs, their capacity and latency spread."""
from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from autoresearch_dagster.engines.base import Engine, EngineError
from autoresearch_dagster.experiments import stats
from autoresearch_dagster.experiments.campaign import Campaign
from autoresearch_dagster.experiments.parallel import RunTask, run_many
from autoresearch_dagster.experiments.runs import (HarnessSettings, Progress, RunRecord, capacity_metric, record_run,
                                                   warm_started)
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import EndpointSpec, config_hash

REFERENCE_FRACTION = 0.8  # reference rate for latency spread = this x the first valid capacity
LATENCY_KEYS = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"), ("tpot_ms", "p99"),
                ("itl_ms", "p99"), ("e2e_ms", "p50"), ("e2e_ms", "p99"))


@dataclass
class NoiseResult:
    endpoint: str
    config_hash: str
    engine: str
    engine_version: str
    capacities: list[float]
    floor: stats.NoiseFloor
    reference_rps: float | None
    latency_spread: dict[str, dict[str, float]]
    runs: list[RunRecord]
    noise_id: str = ""
    estimator: str = "search"  # which per-run capacity the spread is of (HarnessSettings.estimator)
    campaign_id: str | None = None

    @property
    def capacity_cv(self) -> float:
        return self.floor.cv

    def to_dict(self) -> dict:
        return {"noise_id": self.noise_id, "endpoint": self.endpoint, "config_hash": self.config_hash,
                "engine": self.engine, "engine_version": self.engine_version,
                "capacity_cv": self.floor.cv, "runs": len(self.capacities), "capacities": self.capacities,
                "median": self.floor.median, "ci_low": self.floor.ci_low, "ci_high": self.floor.ci_high,
                "ci_method": self.floor.ci_method, "mean": self.floor.mean, "std": self.floor.std,
                "estimator": self.estimator,
                "reference_rps": self.reference_rps, "latency_spread": self.latency_spread,
                "comparison_noise_floor": {str(n): stats.aa_noise_floor(self.floor.cv, n, n)
                                           for n in stats.run_schedule()} if math.isfinite(self.floor.cv) else {},
                "invalid_runs": [{"run_id": r.run_id, "seed": r.seed, "invalid_reasons": r.invalid_reasons}
                                 for r in self.runs if not r.valid],
                "run_details": [r.to_dict() for r in self.runs]}

    def lake_rows(self) -> dict[str, list[dict]]:
        """The measurement's row in ``noise`` (its runs are recorded one by one as they finish)."""
        return {"noise": [{"noise_id": self.noise_id, "campaign_id": self.campaign_id,
                           "config_hash": self.config_hash, "engine": self.engine,
                           "engine_version": self.engine_version, "runs": len(self.capacities),
                           "capacities": self.capacities, "median": self.floor.median, "capacity_cv": self.floor.cv,
                           "ci_low": self.floor.ci_low, "ci_high": self.floor.ci_high,
                           "reference_rps": self.reference_rps,
                           "latency_spread_json": json.dumps(self.latency_spread, sort_keys=True),
                           "measured_at": utc_now()}]}


def measure_noise(endpoint: EndpointSpec, config: dict[str, Any], pool: Any, *, engine: Engine, runs: int = 5,
                  results: Any = None, settings: HarnessSettings | None = None, reference_rps: float | None = None,
                  campaign: Campaign | None = None, progress: Progress = None) -> NoiseResult:
    """``runs`` independent baseline runs (fresh deployment, distinct seeds): capacity spread, and the spread of
    key latency quantiles at a reference rate (given, or 0.8 x the first valid capacity).

    The first run searches from the settings' start and sees the whole load curve (``capacity.curve_run``: what a
    diagnosis and a calibration read); the runs after it start at its capacity (``runs.warm_started``)."""
    if runs < 5:
        raise ValueError(f"measure_noise: need at least 5 runs for a noise floor, got {runs}")
    settings = settings or HarnessSettings()
    cap_metric = capacity_metric(settings)
    recs: list[RunRecord] = []
    valid: list[RunRecord] = []

    def stored(rec: RunRecord) -> None:
        recs.append(rec)
        if rec.valid:
            valid.append(rec)
        if progress:
            progress(f"noise run {len(recs)}: capacity={rec.capacity_rps} valid={rec.valid} {rec.invalid_reasons}")
        record_run(results, endpoint.name, rec, experiment_id=None,
                   campaign_id=campaign.campaign_id if campaign else None, gpus=endpoint.gpus)

    while len(valid) < runs and len(recs) < runs + settings.max_invalid_per_arm:
        # the first valid run fixes the reference rate the others measure their latency spread at; after
        # it, the remaining runs are independent and go out together (in parallel where the engine allows)
        n = 1 if reference_rps is None else min(runs - len(valid), runs + settings.max_invalid_per_arm - len(recs))
        tasks = [RunTask(config=config, arm="baseline", run_index=len(recs) + i,
                         seed=settings.seed * 1_000_003 + 500_000 + len(recs) + i, purpose="noise", mode="capacity",
                         reference_rps=reference_rps,
                         reference_fraction=None if reference_rps else REFERENCE_FRACTION) for i in range(n)]
        run_many(endpoint, pool, tasks, engine=engine, settings=settings, workers=settings.parallel_runs,
                 on_done=stored)
        if valid and not getattr(settings.capacity, "warm_start", False):
            settings = warm_started(settings, valid[0].value(cap_metric))
        if reference_rps is None:
            first = next((r for r in valid if r.reference_step), None)
            if first is not None:
                reference_rps = float(first.reference_step["rate_rps"])
            elif valid:  # a valid run without a reference step (too low a capacity): no spread to measure
                reference_rps = 0.0
    if len(valid) < runs:
        reasons = sorted({x for r in recs for x in r.invalid_reasons})
        err = EngineError(f"noise: only {len(valid)} of {runs} baseline runs were valid after {len(recs)} attempts: "
                          f"{'; '.join(reasons)}")
        err.gpu_seconds = float(sum(r.gpu_seconds for r in recs))  # what the attempts cost (a campaign's budget)
        raise err
    caps = [float(r.value(capacity_metric(settings))) for r in valid]
    floor = stats.noise_floor(caps, seed=settings.seed)
    spread: dict[str, dict[str, float]] = {}
    ref_steps = [r.reference_step for r in valid if r.reference_step]
    for metric, q in LATENCY_KEYS:
        vals = [s[metric][q] for s in ref_steps if (s.get(metric) or {}).get(q) is not None]
        if len(vals) >= 2:
            spread[f"{metric.removesuffix('_ms')}_{q}_ms"] = stats.spread(vals)
    engine_version = next((r.engine_version for r in valid if r.engine_version), "unknown")
    res = NoiseResult(endpoint=endpoint.name, config_hash=config_hash(config),
                      engine=getattr(engine, "name", type(engine).__name__), engine_version=engine_version,
                      capacities=caps, floor=floor, reference_rps=reference_rps or None, latency_spread=spread, runs=recs,
                      noise_id=f"n-{uuid.uuid4().hex[:12]}", estimator=settings.estimator,
                      campaign_id=campaign.campaign_id if campaign else None)
    if results is not None:
        results.append_rows(res.lake_rows(), endpoint=endpoint.name)
    return res
