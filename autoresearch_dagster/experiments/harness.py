"""Owns the experiment harness: noise measurement, baseline-vs-candidate experiments, ablations, campaigns.

One path for every measurement: each run is a fresh deployment through the Engine protocol
(deploy -> health/warm-up -> flush -> measure with RUNNER's ``measure`` -> close), so the same code
serves the emulator, a local SGLang server and the CLI/Dagster callers. Arms are interleaved
ABAB..., every run gets its own seed and is recorded (valid or not); invalid runs never count and
are retried within a per-arm limit. Verdict rules live in ``stats``; the lake in ``results``.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import time
import uuid
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable, Literal, Protocol

import numpy as np

from autoresearch_dagster.experiments import stats
from autoresearch_dagster.engines.base import DRIFT_PREFIX, ConfigDriftError, Deployment, Engine, EngineError, config_drift
from autoresearch_dagster.spec import Budget, EndpointSpec, config_hash, is_lossy

Arm = Literal["baseline", "candidate"]
Progress = Callable[[str], None] | None

WARMUP_REQUESTS = 8
WARMUP_SPACING_S = 0.2
WARMUP_TIMEOUT_S = 300.0
REFERENCE_FRACTION = 0.8  # reference rate for latency spread = this x the first valid capacity
LATENCY_KEYS = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"), ("tpot_ms", "p99"),
                ("itl_ms", "p99"), ("e2e_ms", "p50"), ("e2e_ms", "p99"))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _plain(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return obj


def _hash_obj(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


INTERP_METRIC = "capacity_interp_rps"


def capacity_metric(settings: "HarnessSettings") -> str:
    """The RunRecord field a capacity verdict compares, from ``settings.estimator``."""
    return INTERP_METRIC if settings.estimator == "interp" else "capacity_rps"


def _estimator(metric: str) -> str:
    return {"replay_capacity": "replay search", INTERP_METRIC: "interp"}.get(metric, "search")


def schedule_from_budget(budget: Budget | None) -> tuple[int, ...]:
    """Runs per arm at each stage: initial, doubling, capped (5 -> 10 -> 20 by default)."""
    b = budget or Budget()
    if b.initial_runs_per_arm < 2 or b.max_runs_per_arm < b.initial_runs_per_arm:
        raise ValueError(f"budget: need 2 <= initial_runs_per_arm <= max_runs_per_arm, got "
                         f"{b.initial_runs_per_arm}, {b.max_runs_per_arm}")
    out = [b.initial_runs_per_arm]
    while out[-1] < b.max_runs_per_arm:
        out.append(min(out[-1] * 2, b.max_runs_per_arm))
    return tuple(out)


@dataclass
class HarnessSettings:
    """How each run measures. ``capacity`` is RUNNER's CapacitySettings (None: its defaults)."""
    capacity: Any = None
    mode: Literal["capacity", "shape", "both"] | None = None  # None: the endpoint's workload.mode
    confirm: bool = True  # confirm a "better" on fresh runs before it counts
    max_invalid_per_arm: int = 3  # more invalid runs than this in one arm -> the experiment is invalid
    min_margin: float = stats.MIN_MARGIN
    shape_speedup: float | None = None
    shape_interval_s: float = 60.0
    warmup_requests: int = WARMUP_REQUESTS
    seed: int = 0
    gate_options: dict[str, Any] = field(default_factory=dict)  # passed to the correctness gate
    # per-run capacity statistic of the verdict: "interp" = measure.interpolate_capacity (the rate where
    # the SLA ratio crosses 1; a run without a crossing falls back to its search capacity), "search" =
    # the highest confirmed passing rate of the grow + bisect search
    estimator: Literal["interp", "search"] = "interp"


# ---------------------------------------------------------------- campaign


@dataclass
class Campaign:
    """One endpoint's research under a fixed pool, SLA and correctness requirements."""
    campaign_id: str
    endpoint: str
    pool_hash: str
    sla: str
    sla_hash: str
    correctness_hash: str
    original_config: dict[str, Any]
    original_config_hash: str
    engine: str
    gpus: int

    def to_dict(self) -> dict:
        return asdict(self)


def start_campaign(endpoint: EndpointSpec, pool: Any, *, results: Any = None, engine_name: str | None = None,
                   correctness: dict[str, Any] | None = None,
                   baseline_config: dict[str, Any] | None = None) -> Campaign:
    """The campaign for (endpoint, pool, SLA, correctness requirements): reused from the lake when the
    hashes match, else a new one whose original baseline (the campaign reference) is recorded."""
    pool_hash = str(pool.content_hash)
    sla_hash = _hash_obj(str(endpoint.sla))
    corr_hash = _hash_obj(correctness or {})
    if results is not None:
        for row in results.read("campaigns", endpoint=endpoint.name):
            if (row.get("pool_hash"), row.get("sla_hash"), row.get("correctness_hash")) == (pool_hash, sla_hash, corr_hash):
                return Campaign(campaign_id=row["campaign_id"], endpoint=endpoint.name, pool_hash=pool_hash,
                                sla=str(endpoint.sla), sla_hash=sla_hash, correctness_hash=corr_hash,
                                original_config=json.loads(row["original_config_json"] or "{}"),
                                original_config_hash=row["original_config_hash"],
                                engine=row.get("engine") or endpoint.engine, gpus=int(row.get("gpus") or endpoint.gpus))
    config = dict(endpoint.server_config if baseline_config is None else baseline_config)
    camp = Campaign(campaign_id=f"c-{_hash_obj([endpoint.name, pool_hash, sla_hash, corr_hash])}",
                    endpoint=endpoint.name, pool_hash=pool_hash, sla=str(endpoint.sla), sla_hash=sla_hash,
                    correctness_hash=corr_hash, original_config=config, original_config_hash=config_hash(config),
                    engine=engine_name or endpoint.engine, gpus=endpoint.gpus)
    if results is not None:
        now = _now()
        results.append("endpoints", [{"name": endpoint.name, "model": endpoint.model, "gpu": endpoint.hardware.gpu,
                                      "gpus": endpoint.gpus, "sla": str(endpoint.sla), "engine": endpoint.engine,
                                      "spec_json": endpoint.model_dump(mode="json"), "recorded_at": now}],
                       endpoint=endpoint.name)
        results.append("campaigns", [{**{k: v for k, v in camp.to_dict().items() if k not in ("endpoint", "original_config")},
                                      "original_config_json": json.dumps(config, sort_keys=True),
                                      "created_at": now}], endpoint=endpoint.name)
        record_config(results, endpoint.name, config, source="original")
        results.append("baselines", [{"campaign_id": camp.campaign_id, "config_hash": camp.original_config_hash,
                                      "config_json": json.dumps(config, sort_keys=True), "reason": "original",
                                      "source_experiment_id": None, "recorded_at": now}], endpoint=endpoint.name)
    return camp


def record_config(results: Any, endpoint: str, config: dict[str, Any], *, source: str,
                  baseline: dict[str, Any] | None = None) -> str:
    h = config_hash(config)
    results.append("configs", [{"config_hash": h, "config_json": json.dumps(config, sort_keys=True),
                                "lossy": is_lossy(config, baseline) if baseline is not None else None,
                                "source": source, "recorded_at": _now()}], endpoint=endpoint)
    return h


def record_promotion(results: Any, campaign: Campaign, config: dict[str, Any], *, experiment_id: str | None,
                     capacity_rps_per_gpu: float | None = None) -> None:
    """A confirmed "better" became the working baseline (the campaign's original stays the reference)."""
    results.append("baselines", [{"campaign_id": campaign.campaign_id, "config_hash": config_hash(config),
                                  "config_json": json.dumps(config, sort_keys=True), "reason": "promotion",
                                  "source_experiment_id": experiment_id,
                                  "capacity_rps_per_gpu": capacity_rps_per_gpu, "recorded_at": _now()}],
                   endpoint=campaign.endpoint)


# ---------------------------------------------------------------- one run


@dataclass
class RunRecord:
    run_id: str
    arm: str
    run_index: int
    seed: int
    purpose: str  # noise | experiment | confirmation
    config: dict[str, Any]
    config_hash: str
    valid: bool
    invalid_reasons: list[str]
    capacity_rps: float | None = None
    capacity_rps_per_gpu: float | None = None
    replay_capacity: float | None = None
    capacity_interp_rps: float | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    shape: dict[str, Any] | None = None
    reference_step: dict[str, Any] | None = None
    server_info: dict[str, Any] = field(default_factory=dict)
    engine: str = ""
    engine_version: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    started_at: str = ""
    warnings: list[str] = field(default_factory=list)  # caveats that do not invalidate the run (short holds)

    def value(self, metric: str) -> float | None:
        if metric == "replay_capacity":
            return self.replay_capacity
        if metric == INTERP_METRIC and self.capacity_interp_rps is not None:
            return self.capacity_interp_rps
        return self.capacity_rps

    def to_dict(self) -> dict:
        return asdict(self)


def _server_version(info: dict[str, Any], engine: Any) -> str:
    for key in ("version", "engine_version", "sglang_version"):
        if info.get(key):
            return str(info[key])
    try:
        return str(engine.version())
    except Exception:  # a version we cannot read is recorded as unknown, not a failed run
        return "unknown"


def _step_dict(step: Any) -> dict[str, Any]:
    return _plain(step) if step is not None else {}


def _warm_up(dep: Deployment, pool: Any, endpoint: EndpointSpec, *, n: int, seed: int) -> list[str]:
    from autoresearch_dagster.loadgen.schedule import build_schedule

    if n <= 0:
        return []
    schedule = build_schedule(pool, [i * WARMUP_SPACING_S for i in range(n)], model=endpoint.model,
                              seed=seed, start_index=0)
    outcome = dep.run_step(schedule, step_id=f"warmup-{seed}", timeout_s=WARMUP_TIMEOUT_S)
    bad = [r for r in outcome.records if r.status != "ok"]
    if len(bad) / max(1, len(outcome.records)) > endpoint.sla.max_error_rate:
        classes = sorted({r.error_class or r.status for r in bad})
        return [f"failed warm-up: {len(bad)}/{len(outcome.records)} requests failed ({', '.join(classes)})"]
    return []


def _reference_step(dep: Deployment, pool: Any, endpoint: EndpointSpec, *, rate: float, settings: Any,
                    seed: int) -> dict[str, Any]:
    from autoresearch_dagster.loadgen.schedule import build_schedule, poisson_offsets
    from autoresearch_dagster.measure.capacity import summarize_step

    duration = float(getattr(settings, "step_duration_s", 60.0))
    offsets = poisson_offsets(rate, duration, seed=seed)
    schedule = build_schedule(pool, offsets, model=endpoint.model, seed=seed, start_index=len(offsets))
    outcome = dep.run_step(schedule, step_id=f"reference-{seed}", timeout_s=max(300.0, duration * 10))
    return _step_dict(summarize_step(outcome, endpoint.sla, rate_rps=rate))


def execute_run(endpoint: EndpointSpec, config: dict[str, Any], pool: Any, *, engine: Engine, arm: str,
                run_index: int, seed: int, purpose: str, settings: HarnessSettings, mode: str,
                reference_rps: float | None = None, reference_fraction: float | None = None) -> RunRecord:
    """One fresh deployment measured once. Never raises for engine trouble: the run is recorded invalid."""
    from autoresearch_dagster.measure import capacity as measure

    rec = RunRecord(run_id=f"r-{uuid.uuid4().hex[:12]}", arm=arm, run_index=run_index, seed=seed, purpose=purpose,
                    config=dict(config), config_hash=config_hash(config), valid=False, invalid_reasons=[],
                    engine=getattr(engine, "name", type(engine).__name__), started_at=_now().isoformat())
    t0 = time.monotonic()
    dep = None
    try:
        dep = engine.deploy(config, seed=seed)
        rec.timings["deploy_s"] = time.monotonic() - t0
        rec.server_info = dict(dep.server_info() or {})
        rec.engine_version = _server_version(rec.server_info, engine)
        rec.invalid_reasons += config_drift(config, rec.server_info)
        if not rec.invalid_reasons:
            t1 = time.monotonic()
            rec.invalid_reasons += _warm_up(dep, pool, endpoint, n=settings.warmup_requests, seed=seed)
            rec.timings["warmup_s"] = time.monotonic() - t1
        if not rec.invalid_reasons:
            dep.flush_cache()
            t2 = time.monotonic()
            if mode in ("capacity", "both") or purpose == "noise":
                cap = measure.find_capacity(dep, pool, endpoint.sla, gpus=endpoint.gpus, model=endpoint.model,
                                            settings=settings.capacity, seed=seed)
                rec.capacity_rps = float(cap.capacity_rps)
                rec.capacity_rps_per_gpu = float(cap.capacity_rps_per_gpu)
                rec.capacity_interp_rps = cap.capacity_interp_rps
                rec.warnings += cap.warnings
                rec.steps = [_step_dict(s) for s in cap.steps]
                if not cap.valid:
                    rec.invalid_reasons += list(cap.invalid_reasons) or ["capacity search invalid"]
                first = next((st for st in rec.steps if st.get("kind") != "warmup"), None)
                if first and first.get("error_rate", 0) > endpoint.sla.max_error_rate and rec.capacity_rps == 0:
                    rec.invalid_reasons.append(f"errors over the limit at the lowest rate: "
                                               f"{first['error_rate']:.1%} > {endpoint.sla.max_error_rate:.1%}")
            if mode in ("shape", "both") and purpose != "noise":
                shape = measure.run_shape(dep, pool, endpoint.sla, gpus=endpoint.gpus, model=endpoint.model,
                                          speedup=settings.shape_speedup, search=True,
                                          interval_s=settings.shape_interval_s, seed=seed)
                rec.shape = _plain(shape)
                rec.replay_capacity = float(shape.replay_capacity or 0.0)
                if getattr(shape, "valid", True) is False:
                    rec.invalid_reasons += list(getattr(shape, "invalid_reasons", [])) or ["shape replay invalid"]
            if reference_rps is None and reference_fraction and rec.capacity_rps:
                reference_rps = reference_fraction * rec.capacity_rps
            if reference_rps and not rec.invalid_reasons:
                rec.reference_step = _reference_step(dep, pool, endpoint, rate=reference_rps,
                                                     settings=settings.capacity, seed=seed + 7919)
            rec.timings["measure_s"] = time.monotonic() - t2
    except ConfigDriftError as e:  # raised by engines that check drift while deploying: fatal, never retried
        rec.invalid_reasons += e.drift
    except Exception as e:  # noqa: BLE001 -- any engine failure is a recorded invalid run, never a crash
        rec.invalid_reasons.append(f"crash: {type(e).__name__}: {e}"[:500])
    finally:
        if dep is not None:
            try:
                dep.close()
            except Exception as e:  # noqa: BLE001
                rec.invalid_reasons.append(f"crash on close: {type(e).__name__}: {e}"[:500])
    rec.timings["total_s"] = time.monotonic() - t0
    rec.valid = not rec.invalid_reasons
    return rec


def _run_rows(rec: RunRecord, *, experiment_id: str | None, campaign_id: str | None, gpus: int) -> dict[str, list[dict]]:
    run = {"run_id": rec.run_id, "experiment_id": experiment_id, "campaign_id": campaign_id, "purpose": rec.purpose,
           "arm": rec.arm, "run_index": rec.run_index, "seed": rec.seed, "config_hash": rec.config_hash,
           "engine": rec.engine, "engine_version": rec.engine_version, "gpus": gpus,
           "capacity_rps": rec.capacity_rps, "capacity_rps_per_gpu": rec.capacity_rps_per_gpu,
           "replay_capacity": rec.replay_capacity, "capacity_interp_rps": rec.capacity_interp_rps,
           "valid": rec.valid, "invalid_reasons": rec.invalid_reasons,
           "server_info_json": json.dumps(rec.server_info, sort_keys=True, default=str),
           "timings_json": json.dumps(rec.timings, sort_keys=True), "started_at": dt.datetime.fromisoformat(rec.started_at),
           "duration_s": rec.timings.get("total_s")}
    steps, summaries = [], []
    for i, s in enumerate(rec.steps + ([rec.reference_step] if rec.reference_step else [])):
        row = {"run_id": rec.run_id, "experiment_id": experiment_id, "step_index": i, "step_id": s.get("step_id"),
               **{k: s.get(k) for k in ("kind", "rate_rps", "offered_rps", "achieved_rps", "goodput_rps",
                                        "error_rate", "sla_attainment", "send_lag_p99_ms", "duration_s",
                                        "meets_sla", "queue_growth", "valid")},
               "failed_terms": [str(t) for t in s.get("failed_terms") or []],
               "invalid_reasons": [str(t) for t in s.get("invalid_reasons") or []]}
        for metric in ("ttft", "itl", "tpot", "e2e"):
            q = s.get(f"{metric}_ms") or {}
            for p in ("p50", "p95", "p99"):
                row[f"{metric}_{p}_ms"] = q.get(p)
        steps.append(row)
        summaries.append({"run_id": rec.run_id, "experiment_id": experiment_id, "step_id": s.get("step_id"),
                          **{k: s.get(k) for k in ("n_sent", "n_ok", "n_failed", "n_timeout", "error_rate",
                                                   "achieved_rps", "goodput_rps")}})
    return {"runs": [run], "load_steps": steps, "requests_summary": summaries}


def _record_run(results: Any, endpoint: str, rec: RunRecord, *, experiment_id: str | None,
                campaign_id: str | None, gpus: int) -> None:
    if results is None:
        return
    for table, rows in _run_rows(rec, experiment_id=experiment_id, campaign_id=campaign_id, gpus=gpus).items():
        results.append(table, rows, endpoint=endpoint)


# ---------------------------------------------------------------- noise


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
                                           for n in stats.RUN_SCHEDULE} if math.isfinite(self.floor.cv) else {},
                "invalid_runs": [{"run_id": r.run_id, "seed": r.seed, "invalid_reasons": r.invalid_reasons}
                                 for r in self.runs if not r.valid],
                "run_details": [r.to_dict() for r in self.runs]}


def measure_noise(endpoint: EndpointSpec, config: dict[str, Any], pool: Any, *, engine: Engine, runs: int = 5,
                  results: Any = None, settings: HarnessSettings | None = None, reference_rps: float | None = None,
                  campaign: Campaign | None = None, progress: Progress = None) -> NoiseResult:
    """``runs`` independent baseline runs (fresh deployment, distinct seeds): capacity spread, and the spread of
    key latency quantiles at a reference rate (given, or 0.8 x the first valid capacity)."""
    if runs < 5:
        raise ValueError(f"measure_noise: need at least 5 runs for a noise floor, got {runs}")
    settings = settings or HarnessSettings()
    recs: list[RunRecord] = []
    valid: list[RunRecord] = []
    while len(valid) < runs and len(recs) < runs + settings.max_invalid_per_arm:
        seed = settings.seed * 1_000_003 + 500_000 + len(recs)
        rec = execute_run(endpoint, config, pool, engine=engine, arm="baseline", run_index=len(recs), seed=seed,
                          purpose="noise", settings=settings, mode="capacity", reference_rps=reference_rps,
                          reference_fraction=None if reference_rps else REFERENCE_FRACTION)
        recs.append(rec)
        if rec.valid:
            valid.append(rec)
            if reference_rps is None and rec.reference_step:
                reference_rps = float(rec.reference_step["rate_rps"])
        if progress:
            progress(f"noise run {len(recs)}: capacity={rec.capacity_rps} valid={rec.valid} {rec.invalid_reasons}")
        _record_run(results, endpoint.name, rec, experiment_id=None,
                    campaign_id=campaign.campaign_id if campaign else None, gpus=endpoint.gpus)
    if len(valid) < runs:
        reasons = sorted({x for r in recs for x in r.invalid_reasons})
        raise EngineError(f"noise: only {len(valid)} of {runs} baseline runs were valid after {len(recs)} attempts: "
                          f"{'; '.join(reasons)}")
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
                      capacities=caps, floor=floor, reference_rps=reference_rps, latency_spread=spread, runs=recs,
                      noise_id=f"n-{uuid.uuid4().hex[:12]}", estimator=settings.estimator)
    if results is not None:
        results.append("noise", [{"noise_id": res.noise_id, "campaign_id": campaign.campaign_id if campaign else None,
                                  "config_hash": res.config_hash, "engine": res.engine,
                                  "engine_version": engine_version, "runs": len(caps), "capacities": caps,
                                  "median": floor.median, "capacity_cv": floor.cv, "ci_low": floor.ci_low,
                                  "ci_high": floor.ci_high, "reference_rps": reference_rps,
                                  "latency_spread_json": json.dumps(spread, sort_keys=True),
                                  "measured_at": _now()}], endpoint=endpoint.name)
    return res


# ---------------------------------------------------------------- experiments


@dataclass
class ExperimentResult:
    experiment_id: str
    endpoint: str
    campaign_id: str | None
    kind: str
    parent_id: str | None
    mode: str
    metric: str
    baseline_config: dict[str, Any]
    candidate_config: dict[str, Any]
    lossy: bool
    verdict: str = "invalid"  # better | same | worse | invalid
    confirmed: bool = False
    reason: str = ""
    stats: stats.Verdict | None = None  # the verdict the decision rests on
    stages: list[dict[str, Any]] = field(default_factory=list)  # every verdict computed, in order
    noise_cv: float | None = None
    noise_source: str = ""
    correctness: dict[str, Any] | None = None
    invalid_reasons: list[str] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""

    @property
    def baseline_hash(self) -> str:
        return config_hash(self.baseline_config)

    @property
    def candidate_hash(self) -> str:
        return config_hash(self.candidate_config)

    def values(self, arm: str, purposes: tuple[str, ...] = ("experiment", "confirmation")) -> list[float]:
        return [float(r.value(self.metric)) for r in self.runs
                if r.arm == arm and r.valid and r.purpose in purposes and r.value(self.metric) is not None]

    @property
    def runs_baseline(self) -> int:
        return len(self.values("baseline"))

    @property
    def runs_candidate(self) -> int:
        return len(self.values("candidate"))

    def to_dict(self) -> dict:
        v = self.stats
        return {"experiment_id": self.experiment_id, "endpoint": self.endpoint, "campaign_id": self.campaign_id,
                "kind": self.kind, "parent_id": self.parent_id, "verdict": self.verdict, "confirmed": self.confirmed,
                "reason": self.reason, "metric": self.metric, "mode": self.mode,
                "ratio_median": v.ratio_median if v else None, "ci_low": v.ci_low if v else None,
                "ci_high": v.ci_high if v else None, "margin": v.margin if v else None,
                "confidence": v.confidence if v else None,
                "noise_cv": self.noise_cv, "noise_source": self.noise_source,
                "runs_baseline": self.runs_baseline, "runs_candidate": self.runs_candidate,
                "capacities_baseline": self.values("baseline"), "capacities_candidate": self.values("candidate"),
                "lossy": self.lossy, "correctness": self.correctness, "invalid_reasons": self.invalid_reasons,
                "baseline_config": self.baseline_config, "candidate_config": self.candidate_config,
                "baseline_hash": self.baseline_hash, "candidate_hash": self.candidate_hash,
                "stages": self.stages, "run_order": [f"{r.arm[0].upper()}:{r.purpose}" for r in self.runs],
                "runs": [r.to_dict() for r in self.runs],
                "started_at": self.started_at, "finished_at": self.finished_at}


def correctness_check(endpoint: EndpointSpec, baseline: dict[str, Any], candidate: dict[str, Any], pool: Any, *,
                      engine: Engine, seed: int = 0, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The output-distribution gate for a lossy candidate; any failure to run it counts as not passed."""
    options = dict(options or {})
    try:
        from autoresearch_dagster import correctness
    except ImportError as e:
        return {"passed": False, "error": f"correctness gate unavailable: {e}"}
    deps: list[Deployment] = []
    try:
        if getattr(engine, "name", "") == "emulator":
            res = correctness.emulated_gate(baseline, candidate, seed=seed, **options)
        else:
            deps.append(engine.deploy(baseline, seed=seed))
            deps.append(engine.deploy(candidate, seed=seed + 1))
            options.setdefault("model", endpoint.model)
            res = correctness.gate(deps[0].base_url, deps[1].base_url, options.pop("prompts", None), **options)
    except Exception as e:  # noqa: BLE001 -- a gate that cannot run does not pass
        return {"passed": False, "error": f"correctness gate failed to run: {type(e).__name__}: {e}"[:500]}
    finally:
        for d in deps:
            try:
                d.close()
            except Exception:  # noqa: BLE001 -- closing is best effort once the gate has its answer
                pass
    out = _plain(res)
    return out if isinstance(out, dict) else {"passed": bool(getattr(res, "passed", False)), "result": str(res)}


class RunSource(Protocol):
    """Where an experiment's runs come from when they are not measured on the spot."""

    def __call__(self, arm: str, config: dict[str, Any], *, purpose: str, mode: str, run_index: int,
                 seed: int) -> "RunRecord": ...


class _Experiment:
    """Mutable state of one running experiment: the run counter, seeds, lake writes."""

    def __init__(self, endpoint: EndpointSpec, pool: Any, engine: Engine, results: Any, settings: HarnessSettings,
                 res: ExperimentResult, deadline: float | None, progress: Progress, run_source: "RunSource | None"):
        self.endpoint, self.pool, self.engine, self.results = endpoint, pool, engine, results
        self.settings, self.res, self.deadline, self.progress = settings, res, deadline, progress
        self.run_source = run_source

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def run(self, arm: Arm, purpose: str, mode: str) -> RunRecord:
        index = len(self.res.runs)
        seed = self.settings.seed * 1_000_003 + index + 1
        config = self.res.baseline_config if arm == "baseline" else self.res.candidate_config
        if self.run_source is not None:
            rec = self.run_source(arm, config, purpose=purpose, mode=mode, run_index=index, seed=seed)
        else:
            rec = execute_run(self.endpoint, config, self.pool, engine=self.engine, arm=arm, run_index=index,
                              seed=seed, purpose=purpose, settings=self.settings, mode=mode)
        self.res.runs.append(rec)
        _record_run(self.results, self.endpoint.name, rec, experiment_id=self.res.experiment_id,
                    campaign_id=self.res.campaign_id, gpus=self.endpoint.gpus)
        if self.progress:
            val = rec.value(self.res.metric)
            self.progress(f"  run {index + 1} {arm:9s} {purpose:12s} seed={seed} "
                          f"{self.res.metric}={'-' if val is None else f'{val:.4g}'}"
                          + ("" if rec.valid else f" INVALID: {'; '.join(rec.invalid_reasons)}"))
        return rec

    def fatal(self) -> list[str]:
        """Reasons that make the whole experiment invalid (drift is deterministic; too many invalid runs)."""
        out = sorted({x for r in self.res.runs for x in r.invalid_reasons if x.startswith(DRIFT_PREFIX)})
        for arm in ("baseline", "candidate"):
            bad = [r for r in self.res.runs if r.arm == arm and not r.valid]
            if len(bad) > self.settings.max_invalid_per_arm:
                reasons = sorted({x for r in bad for x in r.invalid_reasons})
                out.append(f"{arm}: {len(bad)} invalid runs (limit {self.settings.max_invalid_per_arm}): "
                           + "; ".join(reasons))
        return out

    def valid_counts(self, purpose: str) -> dict[str, int]:
        """Valid runs of this purpose per arm."""
        return {a: sum(1 for r in self.res.runs if r.arm == a and r.valid and r.purpose == purpose)
                for a in ("baseline", "candidate")}

    def fill(self, target: int, purpose: str, mode: str) -> str | None:
        """Run ABAB pairs until each arm has ``target`` valid runs of this purpose; returns why it stopped early."""
        while True:
            have = self.valid_counts(purpose)
            if min(have.values()) >= target:
                return None
            for arm in ("baseline", "candidate"):
                if self.out_of_time():
                    return "wall-time budget exhausted"
                if have[arm] < target:
                    self.run(arm, purpose, mode)
                if self.fatal():
                    return "invalid"

    def verdict(self, stage: str, purposes: tuple[str, ...] = ("experiment", "confirmation"),
                metric: str | None = None) -> stats.Verdict | None:
        metric = metric or self.res.metric
        b = [float(r.value(metric)) for r in self.res.runs if r.arm == "baseline" and r.valid
             and r.purpose in purposes and r.value(metric) is not None]
        c = [float(r.value(metric)) for r in self.res.runs if r.arm == "candidate" and r.valid
             and r.purpose in purposes and r.value(metric) is not None]
        if len(b) < 2 or len(c) < 2 or float(np.median(b)) <= 0:
            return None
        if self.res.noise_source != "noise_baseline" and metric == self.res.metric:
            self.res.noise_cv = stats.noise_floor(b, seed=self.settings.seed).cv
            self.res.noise_source = "this experiment's baseline runs"
        v = stats.verdict(b, c, noise_cv=self.res.noise_cv or 0.0, min_margin=self.settings.min_margin,
                          seed=self.settings.seed)
        self.record(stage, metric, v)
        return v

    def record(self, stage: str, metric: str, v: stats.Verdict) -> None:
        fallback = sum(1 for r in self.res.runs if r.valid and r.capacity_interp_rps is None) \
            if metric == INTERP_METRIC else 0
        self.res.stages.append({"stage": stage, "metric": metric, "estimator": _estimator(metric),
                                "runs_on_search_fallback": fallback, **v.to_dict()})
        if self.progress:
            self.progress(f"  verdict [{stage}] {v.verdict}: ratio={v.ratio_median:.4f} CI=[{v.ci_low:.4f}, "
                          f"{v.ci_high:.4f}] margin={v.margin:.4f} n={v.n_baseline}/{v.n_candidate}")
        if self.results is not None:
            self.results.append("verdicts", [{
                "verdict_id": f"v-{uuid.uuid4().hex[:12]}", "experiment_id": self.res.experiment_id, "stage": stage,
                "metric": metric, **{k: getattr(v, k) for k in ("verdict", "ratio_median", "ci_low", "ci_high", "margin",
                                                               "noise_cv", "n_baseline", "n_candidate", "p_value",
                                                               "equivalence_shown", "underpowered", "reason",
                                                               "ci_method")},
                "baseline_values": v.baseline, "candidate_values": v.candidate, "decided_at": _now()}],
                endpoint=self.endpoint.name)


def run_experiment(endpoint: EndpointSpec, baseline_config: dict[str, Any], candidate_config: dict[str, Any],
                   pool: Any, *, engine: Engine, results: Any = None, settings: HarnessSettings | None = None,
                   budget: Budget | None = None, noise_cv: float | None = None, campaign: Campaign | None = None,
                   experiment_id: str | None = None, kind: str = "single", parent_id: str | None = None,
                   progress: Progress = None, run_source: "RunSource | None" = None) -> ExperimentResult:
    """Baseline vs candidate on the campaign's pool and SLA, to a verdict with its evidence.

    Lossy candidates pass the correctness gate first. Runs interleave ABAB with fresh deployments;
    stages of 5 -> 10 -> 20 valid runs per arm (from ``budget``) until the verdict is decided; an
    undecided verdict at the cap or when the wall-time budget ends becomes "same" with the reason.
    A "better" is confirmed on fresh runs (plus the production-shape replay in mode "both").
    ``noise_cv`` comes from ``measure_noise``; without it the baseline runs here estimate it.
    ``run_source`` replaces fresh deployments with runs measured earlier by ``execute_run`` (the
    statistical benchmark draws from banks of emulator runs); None measures every run now.
    """
    settings = settings or HarnessSettings()
    mode = settings.mode or endpoint.workload.mode
    if not getattr(engine, "restartable", True):
        raise EngineError(f"engine {getattr(engine, 'name', engine)!r} cannot restart with a new config: "
                          "it measures baselines only")
    schedule = schedule_from_budget(budget)
    deadline = time.monotonic() + budget.max_wall_s if budget and budget.max_wall_s is not None else None
    baseline_config, candidate_config = dict(baseline_config), dict(candidate_config)
    res = ExperimentResult(experiment_id=experiment_id or f"e-{uuid.uuid4().hex[:12]}", endpoint=endpoint.name,
                           campaign_id=campaign.campaign_id if campaign else None, kind=kind, parent_id=parent_id,
                           mode=mode, metric="replay_capacity" if mode == "shape" else capacity_metric(settings),
                           baseline_config=baseline_config, candidate_config=candidate_config,
                           lossy=is_lossy(candidate_config, baseline_config), started_at=_now().isoformat(),
                           noise_cv=noise_cv, noise_source="noise_baseline" if noise_cv is not None else "")
    if results is not None:
        record_config(results, endpoint.name, candidate_config, source=f"candidate:{res.experiment_id}",
                      baseline=baseline_config)
    ex = _Experiment(endpoint, pool, engine, results, settings, res, deadline, progress, run_source)
    if progress:
        progress(f"experiment {res.experiment_id}: {res.baseline_hash} vs {res.candidate_hash} "
                 f"(mode {mode}, lossy={res.lossy}, stages {schedule})")
    if res.lossy:
        res.correctness = correctness_check(endpoint, baseline_config, candidate_config, pool, engine=engine,
                                            seed=settings.seed, options=settings.gate_options)
        if progress:
            progress(f"  correctness gate: passed={res.correctness.get('passed')}")
        if not res.correctness.get("passed"):
            res.invalid_reasons.append("correctness gate failed: "
                                       + "; ".join([str(res.correctness["error"])] if res.correctness.get("error")
                                                   else [str(x) for x in res.correctness.get("reasons") or []]
                                                   or ["no reason given"]))
            return _finish(ex, "invalid", "the candidate changes the model's outputs beyond the calibrated threshold")
    run_mode = "capacity" if mode == "both" else mode
    v: stats.Verdict | None = None
    stop = None
    for i, target in enumerate(schedule):
        more = i + 1 < len(schedule)  # a later stage exists
        stop = ex.fill(target, "experiment", run_mode)
        if stop == "invalid":
            res.invalid_reasons += ex.fatal()
            return _finish(ex, "invalid", "runs cannot support a comparison")
        v = ex.verdict(f"n={target}")
        if stop or v is None:
            break
        if v.verdict == "better" and settings.confirm and more:
            # confirm now; a "better" that does not repeat is not the end of the experiment before the
            # cap: the runs so far (confirmation runs included) stay in the evidence and the next stage adds more
            outcome = _confirm(ex, schedule[0], mode, want="better")
            if outcome.verdict != "undecided":
                return _close(ex, outcome)
            if ex.progress:
                ex.progress(f"  {outcome.reason}; continuing to n={schedule[i + 1]} per arm")
            continue
        if v.verdict == "same" and v.margin > settings.min_margin and more:
            # an equivalence shown only within a noise-inflated margin is not "same" at the practical
            # margin: a true -5% change read as "same within ±7%" after 5 runs; more runs shrink the floor
            if ex.progress:
                ex.progress(f"  same only within ±{v.margin:.4f} (noise floor above the {settings.min_margin:.0%} "
                            f"practical margin); continuing to n={schedule[i + 1]} per arm")
            continue
        if v.verdict != "undecided":
            break
    if v is None:
        res.invalid_reasons.append(f"fewer than 2 valid runs per arm ({stop or 'no valid runs'})")
        return _finish(ex, "invalid", "not enough valid runs")
    if v.verdict == "undecided":
        promising = abs(v.ratio_median - 1) >= v.margin
        if promising and settings.confirm and not stop:
            return _close(ex, _confirm(ex, schedule[0], mode, want="better" if v.ratio_median > 1 else "worse"),
                          final=True)
        v = stats.stop_undecided(v, stop or f"run cap of {schedule[-1]} per arm reached")
        ex.record("stopped", res.metric, v)
    res.stats = v
    if v.verdict != "better" or not settings.confirm:
        return _finish(ex, v.verdict, v.reason, confirmed=False)
    return _close(ex, _confirm(ex, schedule[0], mode, want="better"), final=True)


@dataclass
class _Outcome:
    """What a confirmation concluded: the verdict (``undecided`` = not confirmed, more runs may decide),
    its reason and the verdict over all runs."""
    verdict: str
    reason: str
    pooled: stats.Verdict | None
    confirmed: bool = False
    invalid: bool = False


def _close(ex: _Experiment, out: _Outcome, *, final: bool = False) -> ExperimentResult:
    """Finish the experiment with a confirmation's outcome; at the end of the schedule an unconfirmed
    ("undecided") outcome becomes "same" with the reason, recorded as the stopping verdict."""
    res = ex.res
    if out.invalid:
        return _finish(ex, "invalid", out.reason)
    v = out.pooled
    if out.verdict == "undecided":
        if not final:
            raise ValueError("an unconfirmed outcome closes the experiment only at the end of the schedule")
        v = stats.stop_undecided(stats.Verdict(**{**v.to_dict(), "verdict": "undecided"}), out.reason)
        ex.record("stopped", res.metric, v)
        res.stats = v
        return _finish(ex, "same", out.reason)
    res.stats = v
    return _finish(ex, out.verdict, out.reason, confirmed=out.confirmed)


def _confirm(ex: _Experiment, n: int, mode: str, *, want: str) -> _Outcome:
    """Promising results count only if they repeat on fresh runs and the pooled evidence still decides for them.

    Promising = a "better" at any stage, or an undecided comparison at the run cap whose point estimate
    lies beyond the margin (in either direction). ``n`` fresh runs per arm are added (ABAB, new seeds)
    on top of any earlier confirmation runs; the fresh runs alone must point the same way, the verdict
    over all runs must be ``want``, and in mode "both" the production-shape replay of the fresh runs
    must not be worse. Returns ``want`` when confirmed, "undecided" when not (with why), or the pooled
    verdict when the evidence now decides against ``want``.
    """
    res = ex.res
    earlier = {r.run_id for r in res.runs if r.purpose == "confirmation"}
    have = min(ex.valid_counts("confirmation").values())
    stop = ex.fill(have + n, "confirmation", mode if want == "better" else ("shape" if mode == "shape" else "capacity"))
    if stop == "invalid":
        res.invalid_reasons += ex.fatal()
        return _Outcome("invalid", "confirmation runs cannot support a comparison", None, invalid=True)
    fresh = {arm: [float(r.value(res.metric)) for r in res.runs if r.arm == arm and r.valid
                   and r.purpose == "confirmation" and r.run_id not in earlier and r.value(res.metric) is not None]
             for arm in ("baseline", "candidate")}
    pooled = ex.verdict("confirmation: pooled")
    problems = [stop] if stop else []
    if not fresh["baseline"] or not fresh["candidate"]:
        problems.append("no valid confirmation runs")
    else:
        fresh_ratio = float(np.median(fresh["candidate"]) / np.median(fresh["baseline"]))
        if (fresh_ratio <= 1) if want == "better" else (fresh_ratio >= 1):
            problems.append(f"fresh runs do not repeat the direction (ratio {fresh_ratio:.4f})")
    if pooled is None or pooled.verdict != want:
        problems.append(f"verdict over all runs is {pooled.verdict if pooled else 'unavailable'}")
    if mode == "both" and want == "better":
        shape = ex.verdict("confirmation: production shape", purposes=("confirmation",), metric="replay_capacity")
        if shape is None:
            problems.append("no production-shape replay results")
        elif shape.verdict == "worse" or shape.ratio_median <= 1:
            problems.append(f"production-shape replay does not confirm (ratio {shape.ratio_median:.4f}, {shape.verdict})")
    if pooled is None:
        res.invalid_reasons.append("fewer than 2 valid runs per arm after confirmation")
        return _Outcome("invalid", "not enough valid runs", None, invalid=True)
    if not problems:
        return _Outcome(want, f"confirmed on {n} fresh runs per arm; {pooled.reason}", pooled, confirmed=True)
    why = f"{want} not confirmed: " + "; ".join(problems)
    if pooled.verdict in (want, "undecided"):
        return _Outcome("undecided", why, pooled)
    return _Outcome(pooled.verdict, f"{pooled.reason} ({why})", pooled)


def _finish(ex: _Experiment, verdict: str, reason: str, *, confirmed: bool = False) -> ExperimentResult:
    res = ex.res
    res.verdict, res.reason, res.confirmed = verdict, reason, confirmed
    res.finished_at = _now().isoformat()
    if ex.progress:
        ex.progress(f"experiment {res.experiment_id}: {verdict.upper()} ({reason})")
    if ex.results is not None:
        v = res.stats
        ex.results.append("experiments", [{
            "experiment_id": res.experiment_id, "campaign_id": res.campaign_id, "kind": res.kind,
            "parent_id": res.parent_id, "mode": res.mode, "baseline_hash": res.baseline_hash,
            "candidate_hash": res.candidate_hash, "candidate_json": json.dumps(res.candidate_config, sort_keys=True),
            "lossy": res.lossy, "verdict": verdict, "confirmed": confirmed,
            "ratio_median": v.ratio_median if v else None, "ci_low": v.ci_low if v else None,
            "ci_high": v.ci_high if v else None, "margin": v.margin if v else None, "noise_cv": res.noise_cv,
            "runs_baseline": res.runs_baseline, "runs_candidate": res.runs_candidate,
            "invalid_reasons": res.invalid_reasons,
            "correctness_json": json.dumps(res.correctness, sort_keys=True, default=str) if res.correctness else None,
            "reason": reason, "started_at": dt.datetime.fromisoformat(res.started_at),
            "finished_at": dt.datetime.fromisoformat(res.finished_at)}], endpoint=res.endpoint)
    return res


# ---------------------------------------------------------------- ablations


@dataclass
class AblationResult:
    """A combined candidate with controls (each change alone) and leave-one-out ablations."""
    combined: ExperimentResult
    singles: dict[str, ExperimentResult]
    leave_outs: dict[str, ExperimentResult]
    attribution: dict[str, dict[str, Any]]
    summary: str

    def to_dict(self) -> dict:
        return {"combined": self.combined.to_dict(), "singles": {k: v.to_dict() for k, v in self.singles.items()},
                "leave_outs": {k: v.to_dict() for k, v in self.leave_outs.items()},
                "attribution": self.attribution, "summary": self.summary}


def attribute(single: str, leave_out: str) -> str:
    """Role of one change from its control (alone vs baseline) and its ablation (combined minus it vs combined)."""
    if leave_out == "invalid" or single == "invalid":
        return "unknown (invalid runs)"
    if leave_out == "worse":
        return "carries gain"  # removing it from the combination loses capacity
    if leave_out == "better":
        return "harmful in combination"
    if single == "better":
        return "redundant (gains alone, adds nothing to the others)"
    if single == "worse":
        return "harmful alone, neutral in combination"
    return "no effect"


def run_ablation(endpoint: EndpointSpec, baseline_config: dict[str, Any], changes: dict[str, dict[str, Any]],
                 pool: Any, *, engine: Engine, results: Any = None, settings: HarnessSettings | None = None,
                 budget: Budget | None = None, noise_cv: float | None = None, campaign: Campaign | None = None,
                 progress: Progress = None) -> AblationResult:
    """Test changes found separately, combined: combined vs baseline, each change alone vs baseline (controls),
    and combined-minus-one vs combined (leave-one-out), so the verdict says which change carries the gain."""
    if len(changes) < 2:
        raise ValueError("run_ablation: needs at least two named changes")
    keys = [set(c) for c in changes.values()]
    overlap = {k for i, a in enumerate(keys) for b in keys[i + 1:] for k in a & b}
    if overlap:
        raise ValueError(f"run_ablation: changes overlap on knobs {sorted(overlap)}")
    combined_cfg = dict(baseline_config)
    for c in changes.values():
        combined_cfg.update(c)
    parent = f"a-{uuid.uuid4().hex[:12]}"
    kw = dict(engine=engine, results=results, settings=settings, budget=budget, noise_cv=noise_cv,
              campaign=campaign, parent_id=parent, progress=progress)
    combined = run_experiment(endpoint, baseline_config, combined_cfg, pool, kind="ablation:combined", **kw)
    singles, leave_outs, attribution = {}, {}, {}
    for name, change in changes.items():
        singles[name] = run_experiment(endpoint, baseline_config, {**baseline_config, **change}, pool,
                                       kind=f"ablation:single:{name}", **kw)
        without = dict(baseline_config)
        for other, c in changes.items():
            if other != name:
                without.update(c)
        leave_outs[name] = run_experiment(endpoint, combined_cfg, without, pool, kind=f"ablation:leave_out:{name}", **kw)
        attribution[name] = {"role": attribute(singles[name].verdict, leave_outs[name].verdict),
                             "single_verdict": singles[name].verdict,
                             "single_ratio": singles[name].stats.ratio_median if singles[name].stats else None,
                             "leave_out_verdict": leave_outs[name].verdict,
                             "leave_out_ratio": leave_outs[name].stats.ratio_median if leave_outs[name].stats else None}
    carriers = [n for n, a in attribution.items() if a["role"] == "carries gain"]
    summary = (f"combined: {combined.verdict}"
               + (f" (ratio {combined.stats.ratio_median:.4f})" if combined.stats else "")
               + f"; gain carried by: {', '.join(carriers) if carriers else 'no single change'}; "
               + "; ".join(f"{n}: {a['role']}" for n, a in attribution.items()))
    return AblationResult(combined=combined, singles=singles, leave_outs=leave_outs, attribution=attribution,
                          summary=summary)
