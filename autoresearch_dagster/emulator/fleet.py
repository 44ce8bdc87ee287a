"""Owns the autoscaled fleet's virtual-time driver: ``EngineCore`` replicas behind the router, scaled by the autoscaler.

Each replica is a whole emulated server (its own scheduler, batching and radix cache, started empty)
on ``hardware.count`` GPUs; ``emulator.autoscale`` decides when replicas start, serve, drain and go.
Events run in virtual-time order: arrivals (routed to a serving replica), autoscaler decisions every
``decision_interval_s``, replicas becoming ready, and metric samples every ``sample_interval_s``.
Samples carry the replica counts and the autoscaler's unstabilised recommendation
(``desired_replicas``) beside the engine metrics summed over replicas; a row is added at every
launch, ready, drain and release, so the ``replicas`` column is an exact step function and its
integral is the GPU-seconds held.
"""
from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from autoresearch_dagster.emulator.autoscale import Autoscaler, Replica, Router, recommend, replica_value
from autoresearch_dagster.emulator.core import EmuRequest, EngineCore
from autoresearch_dagster.emulator.sim import TIMESERIES_KEYS, RequestResult
from autoresearch_dagster.spec import Autoscaling

# per-replica ratios are averaged over replicas; every other sample adds up (as EngineCore does over dp ranks)
_RATIO_KEYS = frozenset({"sglang:token_usage", "sglang:cache_hit_rate", "sglang:spec_accept_length",
                         "sglang:new_token_ratio"})


@dataclass
class FleetResult:
    requests: list[RequestResult]
    timeseries: list[dict[str, float]]  # t relative to start_s
    start_s: float
    end_s: float
    replicas: list[Replica]
    events: list[dict]  # the autoscaler's decisions (absolute virtual time)
    stream_interval: int
    wall_s: float

    def replica_seconds(self) -> float:
        """Replica-seconds held between start and end (launch to release, cold start included)."""
        return float(sum(r.held_s(self.start_s, self.end_s) for r in self.replicas))


def _result(core: EngineCore, r, status: str | None = None) -> RequestResult:
    times, counts = core.token_times(r)
    return RequestResult(r.rid, r.arrival, r.first_s, r.finish_s if status is None else None,
                         int(counts.sum()) if len(counts) else 0, r.cached_reported, status or r.status,
                         "deadline" if status else r.error, times, counts)


def simulate_fleet(new_core: Callable[[int], EngineCore], requests: list[EmuRequest], spec: Autoscaling, *,
                   start_s: float, deadline_s: float | None = None, sample_interval_s: float = 1.0) -> FleetResult:
    """Serve ``requests`` (absolute arrival times) on a fleet that starts with ``min_replicas`` ready
    replicas at ``start_s``; ``new_core(i)`` builds replica i's engine. Requests unfinished at
    ``deadline_s`` are aborted and reported as timeouts."""
    wall0 = time.perf_counter()
    reqs = sorted(requests, key=lambda r: r.arrival_s)
    deadline = math.inf if deadline_s is None else deadline_s
    scaler = Autoscaler(spec, start_s)
    router = Router(spec.router)
    cores: dict[int, EngineCore] = {r.idx: new_core(r.idx) for r in scaler.replicas}
    stream_interval = next(iter(cores.values())).knobs["stream_interval"]
    owner: dict[str, int] = {}
    results: list[RequestResult] = []
    rows: list[dict[str, float]] = []

    def advance(t: float) -> None:
        for idx, core in list(cores.items()):
            core.run_until(t)
            rep = scaler.replicas[idx]
            for r in core.pop_finished():
                results.append(_result(core, r))
                rep.outstanding -= 1
                if r.finish_s is not None:
                    rep.last_finish_s = max(rep.last_finish_s, r.finish_s)
        for rep in scaler.release_idle():
            cores.pop(rep.idx, None)

    def readings(t: float) -> tuple[list[Replica], list[float], dict[int, dict[str, float]]]:
        serving = scaler.serving(t)
        metrics = {idx: core.metrics() for idx, core in cores.items() if not scaler.replicas[idx].starting(t)}
        return serving, [replica_value(spec.metric, metrics[r.idx]) for r in serving], metrics

    def sample(t: float) -> None:
        serving, values, metrics = readings(t)
        row = {"t": t - start_s, "desired_replicas": float(recommend(spec, values, len(scaler.active()))),
               "autoscale_metric": float(np.mean(values)) if values else 0.0}
        for k in TIMESERIES_KEYS:
            vals = [m.get(k, 0.0) for m in metrics.values()]
            row[k] = (float(np.mean(vals)) if vals else 0.0) if k in _RATIO_KEYS else float(sum(vals))
        rows.append(row)

    t = start_s
    i = 0
    next_decision = start_s + spec.decision_interval_s
    next_sample = start_s
    while True:
        arrival = reqs[i].arrival_s if i < len(reqs) else math.inf
        if arrival == math.inf and all(c.next_free_s() is None for c in cores.values()):
            break
        ready = min((r.ready_s for r in scaler.active() if r.ready_s > t), default=math.inf)
        nxt = min(arrival, next_decision, next_sample, ready)
        if nxt > deadline:
            break
        advance(nxt)
        t = nxt
        if nxt == next_sample:
            sample(t)
            next_sample += sample_interval_s
        elif nxt == ready:
            sample(t)
        elif nxt == next_decision:
            serving, values, _ = readings(t)
            launched, drained = scaler.decide(t, values)
            for rep in launched:
                cores[rep.idx] = new_core(rep.idx)
            for rep in drained:
                if rep.released_s is not None:
                    cores.pop(rep.idx, None)
            if launched or drained:
                sample(t)
            next_decision += spec.decision_interval_s
        else:
            req = reqs[i]
            rep = router.pick(scaler.serving(t))
            cores[rep.idx].add_request(req, t)
            rep.outstanding += 1
            owner[req.rid] = rep.idx
            i += 1

    done = {r.rid for r in results}
    if len(done) < len(reqs):  # the deadline came first: what is left times out
        advance(deadline)
        done = {r.rid for r in results}
        for rq in reqs:
            if rq.rid in done:
                continue
            core = cores.get(owner.get(rq.rid, -1))
            r = core._by_rid.get(rq.rid) if core is not None else None
            if r is None:
                results.append(RequestResult(rq.rid, rq.arrival_s, None, None, 0, None, "timeout", "deadline",
                                             np.zeros(0), np.zeros(0, dtype=np.int64)))
                continue
            core.abort(rq.rid)
            results.append(_result(core, r, "timeout"))
        for core in cores.values():
            core.pop_finished()
    ends = [r.end_s for r in results if r.end_s is not None]
    end_s = max(ends, default=start_s)
    if math.isfinite(deadline) and any(r.status == "timeout" for r in results):
        end_s = max(end_s, deadline)
    for rep in scaler.replicas:  # a drained replica whose last request ran past the loop is released at its end
        if rep.drain_s is not None and rep.released_s is None:
            rep.released_s = max(rep.drain_s, rep.last_finish_s)
    return FleetResult(results, _with_counts(rows, scaler, start_s, end_s), start_s, end_s, scaler.replicas,
                       scaler.events, stream_interval, time.perf_counter() - wall0)


def _with_counts(rows: list[dict[str, float]], scaler: Autoscaler, start_s: float, end_s: float) -> list[dict[str, float]]:
    """The sampled rows plus one at every replica change inside [start, end] (readings carried from the row
    before), each with the replica counts of its time, computed from the replicas' lifetimes."""
    changes = {t for r in scaler.replicas for t in (r.launched_s, r.ready_s, r.drain_s, r.released_s)
               if t is not None and start_s <= t <= end_s}
    times = [row["t"] for row in rows]
    out = list(rows)
    for c in sorted(changes):
        rel = c - start_s
        if any(abs(x - rel) < 1e-12 for x in times):
            continue
        k = bisect.bisect_right(times, rel) - 1
        out.append({**(rows[k] if k >= 0 else rows[0]), "t": rel})
    out.sort(key=lambda row: row["t"])
    return [{**row, **scaler.counts(start_s + row["t"])} for row in out]
