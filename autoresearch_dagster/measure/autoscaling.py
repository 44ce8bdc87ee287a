"""Owns the autoscaling report of a production-shape replay: replicas over time, scale-up latency, SLA misses
during bursts, GPU-seconds, the mean GPUs held (what an autoscaled endpoint's capacity per GPU divides by), a
candidate's GPUs saved against the baseline in one replay, and the ``autoscaling`` lake rows.

Input is the replay step's engine timeseries, read the same way whoever wrote it: the emulated
fleet's samples (``emulator.fleet``: ``replicas`` held, ``replicas_ready`` serving,
``desired_replicas`` the autoscaler's unstabilised recommendation) or a real endpoint's gauges scraped
during the replay (``loadgen.replicas``: ``replicas`` and, when the spec names it, ``desired_replicas``).
Times are seconds from the replay's start (``t_s`` from the HTTP runner, ``t`` from the emulator).

- GPU-seconds: the integral of ``replicas`` (a step function: each row's count holds until the next
  row, the first from 0, the last to the replay's end) times the GPUs per replica. Cold starts count:
  a launched replica is held before it serves.
- Bursts: where demand exceeded the capacity then serving. With a ``desired_replicas`` series that is
  wherever the autoscaler wanted more replicas than were serving (its target metric is the capacity
  rule); without one, the replay intervals whose target rate exceeded the serving replicas times
  ``replica_capacity_rps`` (when given). SLA misses are counted for the requests scheduled inside and
  outside those windows.
- Scale-up latency: for each rise of the serving count, the time since demand rose: the start of the
  burst window its launch decision fell in (replicas start in launch order; the decision is known when
  ``replicas_starting`` is reported, as the emulator does, and the cold start is the difference), else
  the window the rise ends, else the latest interval at >= 1.5x the previous one's rate.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoresearch_dagster.loadgen.records import RequestRecord
from autoresearch_dagster.measure.step import good_request
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import SLA

BURST_RATE_JUMP = 1.5  # an interval at this multiple of the previous one's rate starts a burst (no desired series)


@dataclass
class ReplicaSeries:
    t: np.ndarray
    held: np.ndarray
    serving: np.ndarray  # held when the source does not report serving replicas apart
    desired: np.ndarray | None
    starting: np.ndarray | None
    serving_reported: bool


def replica_series(timeseries: list[dict[str, Any]]) -> ReplicaSeries | None:
    """The replica columns of an engine timeseries, by time; None when it has fewer than one row with ``replicas``."""
    rows = sorted((r for r in timeseries if "replicas" in r and ("t_s" in r or "t" in r)),
                  key=lambda r: float(r.get("t_s", r.get("t"))))
    if not rows:
        return None
    t = np.asarray([float(r.get("t_s", r.get("t"))) for r in rows])
    held = np.asarray([float(r["replicas"]) for r in rows])
    has_ready = all("replicas_ready" in r for r in rows)
    serving = np.asarray([float(r["replicas_ready"]) for r in rows]) if has_ready else held
    desired = (np.asarray([float(r["desired_replicas"]) for r in rows])
               if all("desired_replicas" in r for r in rows) else None)
    starting = (np.asarray([float(r["replicas_starting"]) for r in rows])
                if all("replicas_starting" in r for r in rows) else None)
    return ReplicaSeries(t, held, serving, desired, starting, has_ready)


def _segments(t: np.ndarray, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """[left, right) of each row's segment inside [0, end]: row k holds from t[k] (0 for the first) to t[k+1] (end for the last)."""
    left = np.concatenate([[0.0], t[1:]])
    right = np.concatenate([t[1:], [max(end_s, float(t[-1]))]])
    return np.clip(left, 0.0, end_s), np.clip(right, 0.0, end_s)


def step_integral(t: np.ndarray, v: np.ndarray, end_s: float) -> float:
    left, right = _segments(t, end_s)
    return float(np.sum(v * np.maximum(0.0, right - left)))


def _windows(t: np.ndarray, flag: np.ndarray, end_s: float) -> list[list[float]]:
    """Merged [start, end) windows where ``flag`` holds, as the step function of the rows."""
    left, right = _segments(t, end_s)
    out: list[list[float]] = []
    for lo, hi, f in zip(left, right, flag):
        if not f or hi <= lo:
            continue
        if out and abs(out[-1][1] - lo) < 1e-9:
            out[-1][1] = float(hi)
        else:
            out.append([float(lo), float(hi)])
    return out


def _burst_starts(intervals: list[dict[str, Any]]) -> list[float]:
    return [cur["start_s"] for prev, cur in zip(intervals, intervals[1:])
            if prev["target_rps"] > 0 and cur["target_rps"] >= BURST_RATE_JUMP * prev["target_rps"]]


def _decisions(s: ReplicaSeries) -> list[float | None]:
    """Per unit of serving growth, in order, the time its replica was launched (None where the series cannot
    tell: no ``replicas_starting``). Replicas start in launch order and cancelled ones are the newest."""
    if s.starting is None:
        return [None] * int(np.sum(np.maximum(0.0, np.diff(s.serving))))
    pending: deque[float] = deque()
    out: list[float | None] = []
    for j in range(1, len(s.t)):
        ready = int(max(0.0, s.serving[j] - s.serving[j - 1]))
        launched = int(s.starting[j] - s.starting[j - 1]) + ready
        if launched > 0:
            pending.extend([float(s.t[j])] * launched)
        for _ in range(max(0, -launched)):
            if pending:
                pending.pop()
        out += [pending.popleft() if pending else None for _ in range(ready)]
    return out


def _scale_ups(s: ReplicaSeries, windows: list[list[float]], intervals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per rise of the serving count: when, from/to, the launch decision, the demand rise it answered."""
    out = []
    burst_starts = _burst_starts(intervals)
    decisions = iter(_decisions(s))
    for k in np.nonzero(np.diff(s.serving) > 0)[0] + 1:
        up = float(s.t[k])
        decision = [next(decisions, None) for _ in range(int(s.serving[k] - s.serving[k - 1]))][-1]
        if s.desired is not None:  # the burst window the launch decision (else the rise itself) fell in
            at = up if decision is None else decision
            rise = next((w[0] for w in windows if w[0] <= at <= w[1] + 1e-9), None)
        else:
            rise = max((b for b in burst_starts if b <= up), default=None)
        out.append({"serving_s": up, "from": float(s.serving[k - 1]), "to": float(s.serving[k]),
                    "demand_rise_s": rise, "decision_s": decision,
                    "latency_s": None if rise is None else up - rise,
                    "cold_start_s": None if decision is None else up - decision})
    return out


def _misses(records: list[RequestRecord], sla: SLA, windows: list[list[float]]) -> dict[str, Any]:
    starts = np.asarray([w[0] for w in windows])
    ends = np.asarray([w[1] for w in windows])
    inside = {"requests": 0, "misses": 0}
    outside = {"requests": 0, "misses": 0}
    for r in records:
        k = int(np.searchsorted(starts, r.scheduled_s, side="right")) - 1
        bucket = inside if k >= 0 and r.scheduled_s < ends[k] else outside
        bucket["requests"] += 1
        bucket["misses"] += 0 if good_request(r, sla) else 1
    rate = lambda b: b["misses"] / b["requests"] if b["requests"] else None  # noqa: E731
    return {"burst_requests": inside["requests"], "burst_sla_misses": inside["misses"], "burst_miss_rate": rate(inside),
            "other_requests": outside["requests"], "other_sla_misses": outside["misses"], "other_miss_rate": rate(outside)}


def autoscaling_report(timeseries: list[dict[str, Any]], records: list[RequestRecord], sla: SLA, *,
                       intervals: list[dict[str, Any]], window_s: float, gpus_per_replica: int,
                       replica_capacity_rps: float | None = None) -> dict[str, Any] | None:
    """The report (module docstring) over [0, ``window_s``]; None when the timeseries has no ``replicas``."""
    s = replica_series(timeseries)
    if s is None:
        return None
    window_s = max(window_s, 0.0)
    replica_s = step_integral(s.t, s.held, window_s)
    if s.desired is not None:
        rule = "desired_replicas > serving"
        windows = _windows(s.t, s.desired > s.serving, window_s)
    elif replica_capacity_rps:
        rule = f"demand > serving x {replica_capacity_rps:g} req/s"
        windows = []
        for iv in intervals:
            width = (intervals[1]["start_s"] - intervals[0]["start_s"]) if len(intervals) > 1 else window_s
            lo, hi = iv["start_s"], iv["start_s"] + width
            mask = (s.t >= lo) & (s.t < hi)
            serving = float(np.mean(s.serving[mask])) if mask.any() else float(
                s.serving[max(0, int(np.searchsorted(s.t, lo, side="right")) - 1)])
            if iv["target_rps"] > serving * replica_capacity_rps:
                if windows and abs(windows[-1][1] - lo) < 1e-9:
                    windows[-1][1] = hi
                else:
                    windows.append([lo, hi])
    else:
        rule, windows = None, []
    ups = _scale_ups(s, windows if s.desired is not None else [], intervals)
    lat = [u["latency_s"] for u in ups if u["latency_s"] is not None]
    report: dict[str, Any] = {
        "gpus_per_replica": gpus_per_replica, "window_s": window_s, "replica_seconds": replica_s,
        "gpu_seconds": replica_s * gpus_per_replica, "mean_replicas": replica_s / window_s if window_s > 0 else None,
        "replicas_min": float(s.held.min()), "replicas_max": float(s.held.max()),
        "scale_ups": ups, "scale_downs": int(np.sum(np.diff(s.held) < 0)),
        "scale_up_latency_median_s": float(np.median(lat)) if lat else None,
        "scale_up_latency_max_s": float(max(lat)) if lat else None,
        "burst_rule": rule, "burst_windows": windows, "burst_s": float(sum(w[1] - w[0] for w in windows)),
        "series": {"t_s": s.t.tolist(), "replicas": s.held.tolist(),
                   "replicas_ready": s.serving.tolist() if s.serving_reported else None,
                   "desired_replicas": None if s.desired is None else s.desired.tolist()},
    }
    if rule is None:
        report.update({k: None for k in ("burst_requests", "burst_sla_misses", "burst_miss_rate", "other_requests",
                                         "other_sla_misses", "other_miss_rate")})
    else:
        report.update(_misses(records, sla, windows))
    return report


def mean_gpus_held(timeseries: list[dict[str, Any]], *, window_s: float, gpus_per_replica: int) -> float | None:
    """GPUs held on average over [0, ``window_s``] (GPU-seconds / window); None without a ``replicas`` series."""
    s = replica_series(timeseries)
    if s is None or not window_s > 0:
        return None
    return step_integral(s.t, s.held, window_s) / window_s * gpus_per_replica


def compare(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """GPUs a candidate saves against the baseline on the same demand: GPU-seconds ratio and mean GPUs held."""
    b, c = baseline["gpu_seconds"], candidate["gpu_seconds"]
    mb, mc = baseline["mean_replicas"], candidate["mean_replicas"]
    return {"gpu_seconds_baseline": b, "gpu_seconds_candidate": c, "gpu_seconds_ratio": c / b if b else None,
            "gpu_seconds_saved": b - c, "mean_replicas_baseline": mb, "mean_replicas_candidate": mc,
            "mean_gpus_saved": (None if mb is None or mc is None else
                                mb * baseline["gpus_per_replica"] - mc * candidate["gpus_per_replica"]),
            "burst_sla_misses_baseline": baseline.get("burst_sla_misses"),
            "burst_sla_misses_candidate": candidate.get("burst_sla_misses")}


def lake_rows(report: dict[str, Any], *, replay_id: str, role: str, config_hash: str, engine: str,
              speedup: float | None, comparison: dict[str, Any] | None = None,
              baseline_replay_id: str | None = None, replay: str = "shape", run_id: str | None = None,
              experiment_id: str | None = None, campaign_id: str | None = None) -> dict[str, list[dict]]:
    """One ``autoscaling`` row per replay (the candidate's with its comparison against the baseline). ``role``
    is the config's part (baseline, candidate, production); ``replay`` what was replayed: ``shape`` (a CLI
    replay), ``demand`` (an experiment run's replay of the production demand curve), ``replay_capacity`` (its
    search's replay at the replay capacity), ``production`` (the replay-vs-production check); a harness run's
    rows carry its ``run_id``, experiment and campaign."""
    series = report["series"]
    return {"autoscaling": [{
        "replay_id": replay_id, "role": role, "replay": replay, "run_id": run_id, "experiment_id": experiment_id,
        "campaign_id": campaign_id, "config_hash": config_hash, "engine": engine, "speedup": speedup,
        "gpus_per_replica": report["gpus_per_replica"], "window_s": report["window_s"],
        "gpu_seconds": report["gpu_seconds"], "mean_replicas": report["mean_replicas"],
        "replicas_min": report["replicas_min"], "replicas_max": report["replicas_max"],
        "scale_ups": len(report["scale_ups"]), "scale_downs": report["scale_downs"],
        "scale_up_latency_median_s": report["scale_up_latency_median_s"],
        "scale_up_latency_max_s": report["scale_up_latency_max_s"], "burst_rule": report["burst_rule"],
        "burst_s": report["burst_s"], "burst_requests": report["burst_requests"],
        "burst_sla_misses": report["burst_sla_misses"], "other_requests": report["other_requests"],
        "other_sla_misses": report["other_sla_misses"], "baseline_replay_id": baseline_replay_id,
        "gpu_seconds_ratio": comparison["gpu_seconds_ratio"] if comparison else None,
        "mean_gpus_saved": comparison["mean_gpus_saved"] if comparison else None,
        "series_t_s": series["t_s"], "series_replicas": series["replicas"],
        "series_ready": series["replicas_ready"], "series_desired": series["desired_replicas"],
        "recorded_at": utc_now()}]}
