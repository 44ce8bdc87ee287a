"""Owns the emulator's autoscaling policy: replica lifecycles, the HPA-like autoscaler and the router (pure, virtual time).

The autoscaler follows Kubernetes' Horizontal Pod Autoscaler (``pkg/controller/podautoscaler``):
every ``decision_interval_s`` it reads the target metric of the serving replicas and recommends
``ceil(sum / target)`` replicas, or no change while ``sum / (target x active)`` is within
``1 +- tolerance`` (replicas still starting count as active, as HPA counts unready pods at zero usage
when scaling up); it scales up to the *lowest* recommendation of the last
``scale_up_stabilization_s`` and down to the *highest* of the last ``scale_down_cooldown_s``
(HPA's ``behavior.scaleUp/scaleDown.stabilizationWindowSeconds``), within [min, max] replicas.
A launched replica serves ``cold_start_s`` after the decision. A replica scaled down stops getting
requests and is released when its last request finishes (one still starting is released at once);
replicas hold GPUs from launch to release. The router sends each request to the serving replica with
the fewest outstanding requests (ties in turn), or strictly in turn (``round_robin``).

Nothing here runs an engine: ``emulator.fleet`` drives real ``EngineCore`` replicas with it.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from autoresearch_dagster.spec import Autoscaling

_EPS = 1e-9


def replica_value(metric: str, m: dict[str, float]) -> float:
    """One replica's reading of the target metric from its SGLang-named metrics."""
    if metric == "running_requests":
        return m.get("sglang:num_running_reqs", 0.0)
    if metric == "queue_length":
        return m.get("sglang:num_queue_reqs", 0.0)
    if metric == "in_flight":
        return m.get("sglang:num_running_reqs", 0.0) + m.get("sglang:num_queue_reqs", 0.0)
    if metric == "kv_usage":
        return m.get("sglang:token_usage", 0.0)
    raise ValueError(f"unknown autoscaling metric {metric!r}")


def recommend(spec: Autoscaling, values: list[float], active: int) -> int:
    """HPA's recommendation from the serving replicas' readings, with ``active`` replicas (serving + starting)."""
    if not values:
        return max(spec.min_replicas, min(spec.max_replicas, active))
    total = float(sum(values))
    if active > 0 and abs(total / (spec.target * active) - 1.0) <= spec.tolerance:
        want = active
    else:
        want = math.ceil(total / spec.target - _EPS)
    return max(spec.min_replicas, min(spec.max_replicas, want))


@dataclass
class Replica:
    idx: int
    launched_s: float
    ready_s: float
    drain_s: float | None = None
    released_s: float | None = None
    outstanding: int = 0
    last_finish_s: float = 0.0

    def serving(self, t: float) -> bool:
        return self.ready_s <= t and (self.drain_s is None or self.drain_s > t)

    def starting(self, t: float) -> bool:
        return self.launched_s <= t < self.ready_s and (self.drain_s is None or self.drain_s > t)

    def held(self, t: float) -> bool:
        return self.launched_s <= t and (self.released_s is None or self.released_s > t)

    def draining(self, t: float) -> bool:
        return self.drain_s is not None and self.ready_s <= self.drain_s <= t and self.held(t)

    def held_s(self, start: float, end: float) -> float:
        """Seconds this replica held its GPUs inside [start, end]."""
        stop = end if self.released_s is None else min(end, self.released_s)
        return max(0.0, stop - max(start, self.launched_s))


class Autoscaler:
    """The replicas of one fleet and the decisions that change them; every decision is logged in ``events``."""

    def __init__(self, spec: Autoscaling, start_s: float):
        self.spec = spec
        self.replicas = [Replica(i, start_s, start_s) for i in range(spec.min_replicas)]
        self._history: deque[tuple[float, int]] = deque()
        self.events: list[dict] = []

    def active(self) -> list[Replica]:
        return [r for r in self.replicas if r.drain_s is None]

    def serving(self, t: float) -> list[Replica]:
        return [r for r in self.replicas if r.serving(t)]

    def counts(self, t: float) -> dict[str, float]:
        """Replicas held (launched, not yet released: what GPUs are paid for), serving, starting, draining at ``t``."""
        reps = self.replicas
        return {"replicas": float(sum(r.held(t) for r in reps)), "replicas_ready": float(sum(r.serving(t) for r in reps)),
                "replicas_starting": float(sum(r.starting(t) for r in reps)),
                "replicas_draining": float(sum(r.draining(t) for r in reps))}

    def decide(self, t: float, values: list[float]) -> tuple[list[Replica], list[Replica]]:
        """One decision at ``t`` from the serving replicas' readings; returns (launched, drained)."""
        s = self.spec
        active = self.active()
        rec = recommend(s, values, len(active))
        self._history.append((t, rec))
        horizon = max(s.scale_up_stabilization_s, s.scale_down_cooldown_s)
        while self._history and self._history[0][0] < t - horizon - _EPS:
            self._history.popleft()
        up = min(r for when, r in self._history if when >= t - s.scale_up_stabilization_s - _EPS)
        down = max(r for when, r in self._history if when >= t - s.scale_down_cooldown_s - _EPS)
        n = len(active)
        new = up if up > n else (down if down < n else n)
        launched: list[Replica] = []
        drained: list[Replica] = []
        if new > n:
            for _ in range(new - n):
                rep = Replica(len(self.replicas), t, t + s.cold_start_s)
                self.replicas.append(rep)
                launched.append(rep)
            self.events.append({"t": t, "kind": "scale_up", "from": n, "to": new, "recommended": rec,
                                "replicas": [r.idx for r in launched], "ready_s": t + s.cold_start_s})
        elif new < n:
            # the newest starting replicas go first (no request lost), then the least busy serving ones
            order = sorted(active, key=lambda r: (not r.starting(t), r.outstanding, -r.idx))
            for rep in order[:n - new]:
                if rep.ready_s > t or rep.outstanding == 0:  # still starting, or idle: released now
                    rep.released_s = max(t, rep.last_finish_s)
                rep.drain_s = t
                drained.append(rep)
            self.events.append({"t": t, "kind": "scale_down", "from": n, "to": new, "recommended": rec,
                                "replicas": [r.idx for r in drained]})
        return launched, drained

    def release_idle(self) -> list[Replica]:
        """Release draining replicas whose last request has finished (at that finish, never before the drain)."""
        out = []
        for rep in self.replicas:
            if rep.drain_s is not None and rep.released_s is None and rep.outstanding == 0:
                rep.released_s = max(rep.drain_s, rep.last_finish_s)
                out.append(rep)
        return out


class Router:
    """Picks the serving replica for each request."""

    def __init__(self, policy: str):
        if policy not in ("least_outstanding", "round_robin"):
            raise ValueError(f"unknown router policy {policy!r}")
        self.policy = policy
        self._turn = 0

    def pick(self, serving: list[Replica]) -> Replica:
        if not serving:
            raise ValueError("no serving replica to route to")
        k = self._turn
        self._turn += 1
        if self.policy == "round_robin":
            return serving[k % len(serving)]
        k %= len(serving)
        return min(serving[k:] + serving[:k], key=lambda r: r.outstanding)  # ties go in turn
