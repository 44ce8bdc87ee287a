"""Owns one run: a fresh deployment deployed, warmed up, measured and closed, and its lake rows.

Every measurement of the experiments goes through ``execute_run`` (deploy -> health/warm-up ->
flush -> measure with RUNNER's ``measure`` -> close), so the same code serves the emulator, a local
SGLang server and the CLI/Dagster callers. A run never raises for engine trouble: it is recorded
invalid with its reasons.

An autoscaled endpoint's run (the spec's ``autoscaling``) also replays the production demand curve
once (mode ``shape``: the search's first replay, at ``shape_speedup`` or 1; modes ``capacity``/``both``:
one extra replay at that speed-up after the capacity search, when ``demand_replay`` is on; mode
``demand``: only that replay) and keeps its autoscaling report (``RunRecord.autoscaling``: GPU-seconds,
scale-ups, SLA misses in bursts), which ``experiments.gpu_savings`` compares between arms. Its
``autoscaling`` lake rows carry the run, experiment, campaign and arm.
"""
from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Any, Callable, Literal

from autoresearch_dagster.engines.base import ConfigDriftError, Deployment, Engine, config_drift
from autoresearch_dagster.experiments import stats
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import EndpointSpec, config_hash

Progress = Callable[[str], None] | None

WARMUP_REQUESTS = 8
WARMUP_SPACING_S = 0.2


def plain(obj: Any) -> Any:
    """A result object as plain data (its ``to_dict`` or dataclass fields)."""
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return obj


INTERP_METRIC = "capacity_interp_rps"


def capacity_metric(settings: "HarnessSettings") -> str:
    """The RunRecord field a capacity verdict compares, from ``settings.estimator``."""
    return INTERP_METRIC if settings.estimator == "interp" else "capacity_rps"


def estimator_name(metric: str) -> str:
    """How the per-run value of ``metric`` was estimated, as the verdict stages record it."""
    return {"replay_capacity": "replay search", INTERP_METRIC: "interp"}.get(metric, "search")


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
    # runs measured at once on local worker processes (experiments.parallel): the emulator's virtual
    # GPUs; engines that hold real resources always run one at a time
    parallel_runs: int = 1
    # stop a comparison as soon as it cannot be "better" (stats.not_better): what a campaign needs to know
    # about a candidate; off, the staged procedure runs on until "same" is shown within the practical margin
    stop_when_not_better: bool = False
    # an autoscaled endpoint's capacity runs also replay the production demand curve once (module doc); a
    # campaign turns it off and compares its best config with the original at its end instead
    demand_replay: bool = True
    # runs whose config's capacity is already estimated (an experiment with a shared control, the noise runs after
    # the first) start their capacity search at that estimate (``CapacitySettings.warmed``) instead of from the
    # profile's low start: on the demo a run then costs half the probes
    warm_start: bool = True


def warm_started(settings: HarnessSettings, estimate: float | None) -> HarnessSettings:
    """``settings`` whose capacity searches start at ``estimate`` (``CapacitySettings.warmed``), when
    ``settings.warm_start`` and the estimate is a capacity; otherwise ``settings`` unchanged."""
    from autoresearch_dagster.measure.profiles import CapacitySettings

    if not settings.warm_start or not estimate or not estimate > 0:
        return settings
    cap = settings.capacity or CapacitySettings()
    return replace(settings, capacity=cap.warmed(float(estimate), estimator=settings.estimator))


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
    # GPU time the run held: seconds the deployment was up (its virtual clock on the emulator) x the
    # endpoint's GPUs; what campaign budgets and the cost per verdict count
    gpu_seconds: float = 0.0
    gpus_held: float | None = None  # what capacity_rps_per_gpu divided by (measure.capacity)
    autoscaling: dict[str, Any] | None = None  # the demand replay's autoscaling report (module doc)
    demand_speedup: float | None = None

    def value(self, metric: str) -> float | None:
        if metric == "replay_capacity":
            return self.replay_capacity
        if metric == INTERP_METRIC and self.capacity_interp_rps is not None:
            return self.capacity_interp_rps
        return self.capacity_rps

    def to_dict(self) -> dict:
        return asdict(self)

    def lake_rows(self, *, experiment_id: str | None, campaign_id: str | None, gpus: int) -> dict[str, list[dict]]:
        """This run's rows: one in ``runs``, one per load step (the reference step last) in ``load_steps`` and
        ``requests_summary``."""
        run = {"run_id": self.run_id, "experiment_id": experiment_id, "campaign_id": campaign_id,
               "purpose": self.purpose, "arm": self.arm, "run_index": self.run_index, "seed": self.seed,
               "config_hash": self.config_hash, "engine": self.engine, "engine_version": self.engine_version,
               "gpus": gpus,
               "capacity_rps": self.capacity_rps, "capacity_rps_per_gpu": self.capacity_rps_per_gpu,
               "replay_capacity": self.replay_capacity, "capacity_interp_rps": self.capacity_interp_rps,
               "valid": self.valid, "invalid_reasons": self.invalid_reasons,
               "server_info_json": json.dumps(self.server_info, sort_keys=True, default=str),
               "timings_json": json.dumps(self.timings, sort_keys=True),
               "started_at": dt.datetime.fromisoformat(self.started_at),
               "duration_s": self.timings.get("total_s"), "gpu_seconds": self.gpu_seconds, "gpus_held": self.gpus_held}
        steps, summaries = [], []
        for i, s in enumerate(self.steps + ([self.reference_step] if self.reference_step else [])):
            row = {"run_id": self.run_id, "experiment_id": experiment_id, "step_index": i,
                   "step_id": s.get("step_id"),
                   **{k: s.get(k) for k in ("kind", "rate_rps", "offered_rps", "n_sent", "achieved_rps", "goodput_rps",
                                            "error_rate", "sla_attainment", "send_lag_p99_ms", "duration_s",
                                            "meets_sla", "queue_growth", "valid", "arrival_seed", "start_index",
                                            "burstiness")},
                   "failed_terms": [str(t) for t in s.get("failed_terms") or []],
                   "invalid_reasons": [str(t) for t in s.get("invalid_reasons") or []]}
            for metric in ("ttft", "itl", "tpot", "e2e"):
                q = s.get(f"{metric}_ms") or {}
                for p in ("p50", "p95", "p99"):
                    row[f"{metric}_{p}_ms"] = q.get(p)
            steps.append(row)
            summaries.append({"run_id": self.run_id, "experiment_id": experiment_id, "step_id": s.get("step_id"),
                              **{k: s.get(k) for k in ("n_sent", "n_ok", "n_failed", "n_timeout", "error_rate",
                                                       "achieved_rps", "goodput_rps")}})
        return {"runs": [run], "load_steps": steps, "requests_summary": summaries,
                **self._autoscaling_rows(experiment_id, campaign_id)}

    def _autoscaling_rows(self, experiment_id: str | None, campaign_id: str | None) -> dict[str, list[dict]]:
        """One ``autoscaling`` row for the demand replay and one for the replay at the replay capacity (when the
        shape search ended elsewhere), linked to this run."""
        from autoresearch_dagster.measure.autoscaling import lake_rows

        shape = self.shape or {}
        replays = [("demand", self.autoscaling, self.demand_speedup)]
        if shape.get("autoscaling") is not None and shape.get("speedup") != self.demand_speedup:
            replays.append(("replay_capacity", shape["autoscaling"], shape.get("speedup")))
        rows = [row for replay, report, speedup in replays if report is not None
                for row in lake_rows(report, replay_id=f"{self.run_id}:{replay}", role=self.arm,
                                     config_hash=self.config_hash, engine=self.engine, speedup=speedup, replay=replay,
                                     run_id=self.run_id, experiment_id=experiment_id,
                                     campaign_id=campaign_id)["autoscaling"]]
        return {"autoscaling": rows} if rows else {}


def _server_version(info: dict[str, Any], engine: Any) -> str:
    for key in ("version", "engine_version", "sglang_version"):
        if info.get(key):
            return str(info[key])
    try:
        return str(engine.version())
    except Exception:  # a version we cannot read is recorded as unknown, not a failed run
        return "unknown"


def _step_dict(step: Any) -> dict[str, Any]:
    return plain(step) if step is not None else {}


def _warm_up(dep: Deployment, pool: Any, endpoint: EndpointSpec, *, n: int, seed: int,
             request_timeout_s: float) -> list[str]:
    from autoresearch_dagster.measure.step import run_offsets

    if n <= 0:
        return []
    outcome = run_offsets(dep, pool, [i * WARMUP_SPACING_S for i in range(n)], endpoint.sla,
                          rate_rps=1.0 / WARMUP_SPACING_S, model=endpoint.model, seed=seed, step_id=f"warmup-{seed}",
                          request_timeout_s=request_timeout_s, kind="warmup").outcome
    bad = [r for r in outcome.records if r.status != "ok"]
    if len(bad) / max(1, len(outcome.records)) > endpoint.sla.max_error_rate:
        classes = sorted({r.error_class or r.status for r in bad})
        return [f"failed warm-up: {len(bad)}/{len(outcome.records)} requests failed ({', '.join(classes)})"]
    return []


def _reference_step(dep: Deployment, pool: Any, endpoint: EndpointSpec, *, rate: float, settings: Any,
                    seed: int) -> dict[str, Any]:
    from autoresearch_dagster.measure.step import run_offsets, step_offsets

    offsets = step_offsets(rate, float(settings.step_duration_s), seed=seed)
    run = run_offsets(dep, pool, offsets, endpoint.sla, rate_rps=rate, model=endpoint.model, seed=seed,
                      step_id=f"reference-{seed}", request_timeout_s=settings.request_timeout_s,
                      start_index=len(offsets))
    return _step_dict(run.step)


def execute_run(endpoint: EndpointSpec, config: dict[str, Any], pool: Any, *, engine: Engine, arm: str,
                run_index: int, seed: int, purpose: str, settings: HarnessSettings, mode: str,
                reference_rps: float | None = None, reference_fraction: float | None = None) -> RunRecord:
    """One fresh deployment measured once. Never raises for engine trouble: the run is recorded invalid."""
    from autoresearch_dagster.measure import capacity as measure
    from autoresearch_dagster.measure.shape import run_shape

    rec = RunRecord(run_id=f"r-{uuid.uuid4().hex[:12]}", arm=arm, run_index=run_index, seed=seed, purpose=purpose,
                    config=dict(config), config_hash=config_hash(config), valid=False, invalid_reasons=[],
                    engine=getattr(engine, "name", type(engine).__name__), started_at=utc_now().isoformat())
    t0 = time.monotonic()
    dep = None
    try:
        dep = engine.deploy(config, seed=seed)
        rec.timings["deploy_s"] = time.monotonic() - t0
        rec.server_info = dict(dep.server_info() or {})
        rec.engine_version = _server_version(rec.server_info, engine)
        rec.invalid_reasons += config_drift(config, rec.server_info, endpoint.engine)
        if not rec.invalid_reasons:
            t1 = time.monotonic()
            rec.invalid_reasons += _warm_up(dep, pool, endpoint, n=settings.warmup_requests, seed=seed,
                                            request_timeout_s=settings.capacity.request_timeout_s)
            rec.timings["warmup_s"] = time.monotonic() - t1
        if not rec.invalid_reasons:
            dep.flush_cache()
            t2 = time.monotonic()
            if mode in ("capacity", "both") or purpose == "noise":
                cap = measure.find_capacity(dep, pool, endpoint.sla, gpus=endpoint.gpus, model=endpoint.model,
                                            settings=settings.capacity, seed=seed)
                rec.capacity_rps = float(cap.capacity_rps)
                rec.capacity_rps_per_gpu = float(cap.capacity_rps_per_gpu)
                rec.gpus_held = cap.gpus_held
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
                shape = run_shape(dep, pool, endpoint.sla, gpus=endpoint.gpus, model=endpoint.model,
                                  speedup=settings.shape_speedup, search=True, interval_s=settings.shape_interval_s,
                                  seed=seed, request_timeout_s=settings.capacity.request_timeout_s)
                rec.shape = plain(shape)
                rec.replay_capacity = float(shape.replay_capacity or 0.0)
                rec.autoscaling, rec.demand_speedup = shape.demand_autoscaling, shape.demand_speedup
                if getattr(shape, "valid", True) is False:
                    rec.invalid_reasons += list(getattr(shape, "invalid_reasons", [])) or ["shape replay invalid"]
            if endpoint.autoscaling is not None and purpose != "noise" and not rec.invalid_reasons and (
                    mode == "demand" or (mode in ("capacity", "both") and settings.demand_replay
                                         and rec.shape is None)):
                demand = run_shape(dep, pool, endpoint.sla, gpus=endpoint.gpus, model=endpoint.model,
                                   speedup=settings.shape_speedup or 1.0, interval_s=settings.shape_interval_s,
                                   seed=seed, request_timeout_s=settings.capacity.request_timeout_s)
                rec.autoscaling, rec.demand_speedup = demand.demand_autoscaling, demand.demand_speedup
                if not demand.valid:
                    rec.invalid_reasons += demand.invalid_reasons or ["demand replay invalid"]
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
            held = getattr(dep, "held_s", None)
            rec.gpu_seconds = float(held if held is not None else time.monotonic() - t0) * endpoint.gpus
            try:
                dep.close()
            except Exception as e:  # noqa: BLE001
                rec.invalid_reasons.append(f"crash on close: {type(e).__name__}: {e}"[:500])
    rec.timings["total_s"] = time.monotonic() - t0
    rec.valid = not rec.invalid_reasons
    return rec


def record_run(results: Any, endpoint: str, rec: RunRecord, *, experiment_id: str | None,
               campaign_id: str | None, gpus: int) -> None:
    """Write one run's rows to the lake (None: nothing is recorded)."""
    if results is not None:
        results.append_rows(rec.lake_rows(experiment_id=experiment_id, campaign_id=campaign_id, gpus=gpus),
                            endpoint=endpoint)
