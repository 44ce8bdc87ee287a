"""Owns the production-shape replay: the pool's own arrival shape at a speed-up, judged per interval.

``run_shape`` replays the pool's production shape at a speed-up (``step.run_offsets`` with
``shape_offsets``); per-interval SLA attainment; replay capacity = the largest speed-up meeting the
SLA (``capacity.grow_bisect``); the autoscaling report (``measure.autoscaling``) from the engine's
``replicas`` timeseries when it has one (an autoscaled emulator fleet, or a real endpoint's replica gauge),
for the replay at the replay capacity and for the demand replay: the one at the speed-up the search
started from (1 unless set: the production demand curve as logged), the same demand whatever the config,
so GPU-seconds compare across configs there (``experiments.gpu_savings``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from autoresearch_dagster.engines.base import Deployment
from autoresearch_dagster.loadgen.records import RequestRecord, StepOutcome
from autoresearch_dagster.loadgen.schedule import interval_counts, shape_offsets
from autoresearch_dagster.measure.autoscaling import autoscaling_report
from autoresearch_dagster.measure.capacity import confirmed, grow_bisect, no_pass_reason
from autoresearch_dagster.measure.profiles import REQUEST_TIMEOUT_S
from autoresearch_dagster.measure.step import LoadStep, good_request, metric_values, run_offsets
from autoresearch_dagster.spec import SLA

@dataclass
class ShapeResult:
    speedup: float | None  # the speed-up replayed (the confirmed replay capacity when searching)
    replay_capacity: float | None  # largest speed-up meeting the SLA (None unless searched)
    meets_sla: bool
    intervals: list[dict[str, Any]]  # per replay interval: target rate, sent, ok, attainment, p99s, meets_sla
    steps: list[LoadStep]
    valid: bool
    invalid_reasons: list[str]
    autoscaling: dict[str, Any] | None
    outcomes: list[StepOutcome] = field(default_factory=list, repr=False)
    sla: str = ""
    demand_speedup: float | None = None  # the speed-up of the demand replay (the search's first)
    demand_autoscaling: dict[str, Any] | None = None  # its autoscaling report (module docstring)

    def to_dict(self) -> dict[str, Any]:
        return {"replay_capacity": self.replay_capacity, "speedup": self.speedup, "meets_sla": self.meets_sla,
                "intervals": self.intervals, "steps": [s.to_dict() for s in self.steps], "valid": self.valid,
                "invalid_reasons": self.invalid_reasons, "autoscaling": self.autoscaling, "sla": self.sla,
                "demand_speedup": self.demand_speedup, "demand_autoscaling": self.demand_autoscaling}


def interval_attainment(outcome: StepOutcome, sla: SLA, *, replay_interval_s: float,
                        target_counts: list[int], speedup: float) -> list[dict[str, Any]]:
    """Per replay interval: target rate, requests sent/ok, SLA attainment and the interval's own verdict."""
    rows = []
    buckets: dict[int, list[RequestRecord]] = {}
    for r in outcome.records:
        buckets.setdefault(int(r.scheduled_s // replay_interval_s), []).append(r)
    for k, target in enumerate(target_counts):
        recs = buckets.get(k, [])
        ok = [r for r in recs if r.status == "ok"]
        good = sum(1 for r in ok if good_request(r, sla))
        ttft = metric_values(ok, "ttft")
        tpot = metric_values(ok, "tpot")
        meets = bool(recs) and all(
            (v := metric_values(ok, t.metric)).size > 0 and float(np.percentile(v, t.quantile)) * 1e3 <= t.max_ms
            for t in sla.terms) and (len(recs) - len(ok)) / len(recs) <= sla.max_error_rate
        rows.append({
            "interval": k, "start_s": k * replay_interval_s, "target_rps": target / replay_interval_s,
            "original_rps": target / (replay_interval_s * speedup), "sent": len(recs), "ok": len(ok),
            "attainment": good / len(recs) if recs else None,
            "ttft_p99_ms": float(np.percentile(ttft, 99)) * 1e3 if ttft.size else None,
            "tpot_p99_ms": float(np.percentile(tpot, 99)) * 1e3 if tpot.size else None,
            "meets_sla": meets if recs else None,
        })
    return rows


def run_shape(deployment: Deployment, pool: Any, sla: SLA, *, gpus: int, model: str, speedup: float | None = None,
              search: bool = False, interval_s: float = 60.0, seed: int = 0, request_timeout_s: float = REQUEST_TIMEOUT_S,
              growth: float = 2.0, resolution: float = 0.05, max_steps: int = 12, flush_cache: bool = True,
              gpus_per_replica: int | None = None, replica_capacity_rps: float | None = None,
              progress: Callable[[LoadStep], None] | None = None) -> ShapeResult:
    if not search and speedup is None:
        speedup = 1.0
    arrivals = [float(r.arrival_s) for r in pool.iter_requests("serving")]
    _, counts = interval_counts(arrivals, interval_s)
    steps: list[LoadStep] = []
    outcomes: list[StepOutcome] = []
    details: dict[float, tuple[StepOutcome, LoadStep]] = {}

    def replay(x: float, kind: str) -> LoadStep:
        k = len(steps)
        offsets = shape_offsets(pool, speedup=x, interval_s=interval_s, seed=seed * 1000 + k)
        run = run_offsets(deployment, pool, offsets, sla, rate_rps=x, model=model, seed=seed * 1000 + k,
                          step_id=f"shape{k:02d}-x{x:.4g}", request_timeout_s=request_timeout_s, aligned=True,
                          flush_cache=flush_cache, kind="shape" if kind == "capacity" else kind, progress=progress)
        steps.append(run.step)
        outcomes.append(run.outcome)
        details[x] = (run.outcome, run.step)
        if progress:
            progress(run.step)
        return run.step

    replay_capacity = None
    demand = speedup or 1.0
    if search:
        replay_capacity, _ = grow_bisect(lambda x, kind: replay(x, kind).passed, start=demand,
                                         growth=growth, resolution=resolution, max_steps=max_steps)
        chosen = replay_capacity if replay_capacity and replay_capacity in details else None
        if chosen is None:  # nothing passed: report the slowest replay tried
            chosen = min(details)
        speedup = chosen
    else:
        replay(speedup, "capacity")

    def report(x: float) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        outcome = details[x][0]
        intervals = interval_attainment(outcome, sla, replay_interval_s=interval_s / x, target_counts=counts,
                                        speedup=x)
        return intervals, autoscaling_report(outcome.engine_timeseries, outcome.records, sla, intervals=intervals,
                                             window_s=outcome.duration_s, gpus_per_replica=gpus_per_replica or gpus,
                                             replica_capacity_rps=replica_capacity_rps)

    step = details[speedup][1]
    intervals, auto = report(speedup)
    demand_auto = auto if demand == speedup else report(demand)[1]
    reasons = [f"{st.step_id}: {r}" for st in steps for r in st.invalid_reasons]
    if search and replay_capacity and not confirmed(steps, replay_capacity):
        reasons.append(f"search stopped after {max_steps} steps before confirming a replay capacity")
    if search:
        none_passed, _ = no_pass_reason([(st.rate_rps, st.passed) for st in steps], start=demand, growth=growth,
                                        max_steps=max_steps, unit="x speed-up")
        reasons += [none_passed] if none_passed else []
    return ShapeResult(speedup=speedup, replay_capacity=replay_capacity, meets_sla=step.meets_sla,
                       intervals=intervals, steps=steps, valid=not reasons, invalid_reasons=reasons,
                       autoscaling=auto, outcomes=outcomes, sla=str(sla), demand_speedup=demand,
                       demand_autoscaling=demand_auto)
