"""Owns the replay-vs-production check's run: the production config replays the pool at production speed,
and what the engine did is compared with what production did (``pool.production_fidelity``).

The config replayed is the endpoint spec's ``server_config``, the one that served the logged
traffic, not the working baseline: a promoted baseline is faster than production by design, and its
in-flight counts would rightly differ. The check is about the pool and the replay, so the server
is held at what production ran. A fresh deployment, its cache flushed, gets every request of the
pool at its recorded time (``schedule.recorded_offsets``: production's own timing, speed-up 1) with
the measurement profile's per-request timeout. Every request, the training split too: production
served them all, and the serving split alone underloads the server by the held-out share (on the
demo, 10% fewer requests made 20% fewer in flight: decoding slows as the batch grows). No warm-up:
the prefix cache starts empty either way, and a warm-up's requests would only shift the clock.

An autoscaled endpoint (the spec's ``autoscaling``) replays on its fleet, and the report adds the
autoscaling report of that replay (``measure.autoscaling``: replicas over time, GPU-seconds, scale-up
latency, SLA misses in bursts; intervals of ``INTERVAL_S`` judge bursts where no desired-replicas series
exists), saved as ``autoscaling.png`` and one ``autoscaling`` lake row (role and replay ``production``).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from autoresearch_dagster.loadgen.records import RequestRecord, records_to_table
from autoresearch_dagster.loadgen.schedule import interval_counts, recorded_offsets
from autoresearch_dagster.measure.autoscaling import autoscaling_report
from autoresearch_dagster.measure.autoscaling import lake_rows as autoscaling_rows
from autoresearch_dagster.measure.profiles import REQUEST_TIMEOUT_S
from autoresearch_dagster.measure.shape import interval_attainment
from autoresearch_dagster.measure.step import run_offsets
from autoresearch_dagster.outputs.files import atomic_write, write_json
from autoresearch_dagster.pool.production import Timeline, replay_timeline
from autoresearch_dagster.pool.production_fidelity import ReplayThresholds, compare
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import EndpointSpec, config_hash

INTERVAL_S = 60.0  # the autoscaling report's demand intervals (as replay shape's default)

class _EveryRequest:
    """A pool whose requests all replay (the schedule's builders take the ``serving`` ones)."""

    def __init__(self, pool: Any):
        self.requests = list(pool.iter_requests(None))
        self.content_hash = getattr(pool, "content_hash", None)

    def iter_requests(self, split: str | None = "serving") -> Any:
        return iter(self.requests)


@dataclass
class ProductionReplay:
    report: dict  # pool.production_fidelity.compare's report, plus what was replayed
    records: list[RequestRecord]
    intervals: list[dict] | None = None  # per-interval demand and SLA (autoscaled endpoints only)

    @property
    def autoscaling(self) -> dict | None:
        return self.report.get("autoscaling")

    def save(self, directory: str | Path) -> Path:
        """``production_replay.json`` (the report), ``production_replay_records.parquet`` (every request
        the replay sent) and, for an autoscaled endpoint, ``autoscaling.png`` in ``directory``; returns the
        report's path."""
        from autoresearch_dagster.outputs.plots import plot_autoscaling

        directory = Path(directory)
        atomic_write(directory / "production_replay_records.parquet",
                     lambda tmp: pq.write_table(records_to_table(self.records), tmp))
        if self.autoscaling is not None:
            self.report["autoscaling_plot"] = str(plot_autoscaling([("production config", self.autoscaling)],
                                                                   self.intervals or [],
                                                                   directory / "autoscaling.png"))
        return write_json(directory / "production_replay.json", self.report, sort_keys=True)

    def lake_rows(self) -> dict[str, list[dict]]:
        """One ``production_fidelity`` row per property (skipped ones included, with the reason); for an
        autoscaled endpoint, its ``autoscaling`` row."""
        r = self.report
        now = utc_now()
        auto = {} if self.autoscaling is None else autoscaling_rows(
            self.autoscaling, replay_id=r["check_id"], role="production", config_hash=r["config_hash"],
            engine=str(r.get("engine") or ""), speedup=1.0, replay="production")
        return {**auto, "production_fidelity": [
            {"check_id": r["check_id"], "pool_hash": r["pool_hash"],
             "config_hash": r["config_hash"], "engine_version": r["engine_version"], "property": c["name"],
             "unit": c["unit"], "production": c["production"], "replay": c["replay"], "drift": c["drift"],
             "drift_limit": c["limit"], "passed": c["passed"], "skipped": c.get("skipped"), "recorded_at": now}
            for c in r["checks"]]}


def replay_production(endpoint: EndpointSpec, pool: Any, production: Timeline, *, engine: Any, seed: int = 0,
                      request_timeout_s: float = REQUEST_TIMEOUT_S,
                      thresholds: ReplayThresholds | None = None) -> ProductionReplay:
    """Replay the pool on a fresh deployment of the production config and compare it with production."""
    config = dict(endpoint.server_config)
    pool = _EveryRequest(pool)
    offsets = recorded_offsets(pool)
    dep = engine.deploy(config, seed=seed)
    try:
        info = dict(dep.server_info() or {})
        span = max(offsets) if offsets else 0.0
        run = run_offsets(dep, pool, offsets, endpoint.sla, rate_rps=(len(offsets) - 1) / span if span > 0 else 0.0,
                          model=endpoint.model, seed=seed, step_id=f"production-replay-{seed}",
                          request_timeout_s=request_timeout_s, aligned=True, flush_cache=True, kind="shape")
    finally:
        dep.close()
    records = run.outcome.records
    report = compare(production, replay_timeline(records), thresholds)
    step = run.step
    intervals = None
    if endpoint.autoscaling is not None:
        _, counts = interval_counts(offsets, INTERVAL_S)
        intervals = interval_attainment(run.outcome, endpoint.sla, replay_interval_s=INTERVAL_S,
                                        target_counts=counts, speedup=1.0)
        report["autoscaling"] = autoscaling_report(run.outcome.engine_timeseries, records, endpoint.sla,
                                                   intervals=intervals, window_s=run.outcome.duration_s,
                                                   gpus_per_replica=endpoint.gpus)
    report.update({
        "check_id": f"pr-{uuid.uuid4().hex[:12]}", "pool_hash": pool.content_hash,
        "config": config, "config_hash": config_hash(config),
        "engine_version": str(info.get("version") or getattr(engine, "version", lambda: "unknown")()),
        "speedup": 1.0, "seed": seed, "engine": getattr(engine, "name", type(engine).__name__),
        "replay_step": {"n_sent": step.n_sent, "n_ok": step.n_ok, "error_rate": step.error_rate,
                        "sla_attainment": step.sla_attainment, "duration_s": step.duration_s,
                        "ttft_ms": step.ttft_ms, "tpot_ms": step.tpot_ms, "e2e_ms": step.e2e_ms}})
    return ProductionReplay(report=report, records=records, intervals=intervals)
