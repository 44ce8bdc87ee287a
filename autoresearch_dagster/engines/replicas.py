"""Owns watching a real autoscaled endpoint's replica count during a step: Prometheus gauges sampled beside the runner.

``ReplicaWatch`` wraps an HTTP deployment: while each step runs, a thread reads ``metrics_url`` every
``interval_s`` and adds ``{"t_s", "replicas"[, "desired_replicas"]}`` rows to the step's engine
timeseries, on the runner's clock (``t_s`` from the step's start, ``meta["t0_monotonic"]``), so
``measure.autoscaling`` reports a real fleet as it reports the emulated one. Each gauge is summed over
its label sets (one series per deployment or HPA adds up). A scrape that fails or lacks the gauge adds
no row; nothing is guessed.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from autoresearch_dagster.engines.base import http_request
from autoresearch_dagster.loadgen.prometheus import MetricsError, parse_prometheus
from autoresearch_dagster.loadgen.records import ScheduledRequest, StepOutcome


def gauge(text: str, name: str) -> float | None:
    """The sum of gauge ``name`` over its label sets; None when the text has no such sample."""
    vals = [s.value for s in parse_prometheus(text) if s.name == name]
    return float(sum(vals)) if vals else None


class ReplicaWatch:
    """A Deployment that samples the replica gauges while the wrapped deployment runs each step."""

    def __init__(self, inner: Any, *, metrics_url: str, replicas_metric: str, desired_metric: str | None = None,
                 interval_s: float = 1.0):
        self.inner = inner
        self.metrics_url = metrics_url
        self.replicas_metric = replicas_metric
        self.desired_metric = desired_metric
        self.interval_s = interval_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _read(self) -> dict[str, float] | None:
        status, body = http_request(self.metrics_url, timeout=min(2.0, max(0.2, self.interval_s)))
        if status != 200:
            return None
        try:
            text = body.decode("utf-8", "replace")
            replicas = gauge(text, self.replicas_metric)
            desired = gauge(text, self.desired_metric) if self.desired_metric else None
        except MetricsError:
            return None
        if replicas is None:
            return None
        return {"replicas": replicas, **({"desired_replicas": desired} if desired is not None else {})}

    def run_step(self, schedule: list[ScheduledRequest], *, step_id: str, timeout_s: float) -> StepOutcome:
        samples: list[tuple[float, dict[str, float]]] = []
        stop = threading.Event()

        def watch() -> None:
            while True:
                t = time.perf_counter()
                row = self._read()
                if row is not None:
                    samples.append((t, row))
                if stop.wait(self.interval_s):
                    return

        thread = threading.Thread(target=watch, name="replica-watch", daemon=True)
        started = time.perf_counter()
        thread.start()
        try:
            outcome = self.inner.run_step(schedule, step_id=step_id, timeout_s=timeout_s)
        finally:
            stop.set()
            thread.join(timeout=5.0)
        t0 = float(outcome.meta.get("t0_monotonic", started))
        rows = [{"t_s": t - t0, **row} for t, row in samples]
        outcome.engine_timeseries = sorted([*outcome.engine_timeseries, *rows], key=lambda r: r.get("t_s", 0.0))
        return outcome
