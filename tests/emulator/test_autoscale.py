"""Autoscaling policy (HPA recommendation, stabilization, router) and the fleet of real EngineCore replicas it drives."""
import numpy as np
import pytest

from autoresearch_dagster.emulator.autoscale import Autoscaler, Replica, Router, recommend, replica_value
from autoresearch_dagster.emulator.core import EmuRequest
from autoresearch_dagster.emulator.fleet import simulate_fleet
from autoresearch_dagster.spec import Autoscaling

from .helpers import core


def _spec(**kw) -> Autoscaling:
    base = {"min_replicas": 1, "max_replicas": 6, "metric": "in_flight", "target": 24, "decision_interval_s": 5,
            "cold_start_s": 10, "scale_down_cooldown_s": 20}
    return Autoscaling(**{**base, **kw})


def test_recommendation_is_hpas_rule():
    s = _spec(target=8, max_replicas=5)
    assert recommend(s, [20.0, 20.0], active=2) == 5  # ceil(40 / 8)
    assert recommend(s, [8.5, 7.9], active=2) == 2  # within 10% of the target: no change
    assert recommend(s, [30.0, 30.0], active=2) == 5  # at most max_replicas
    assert recommend(s, [0.0, 0.0], active=2) == 1  # at least min_replicas
    # a replica still starting counts as active (HPA counts unready pods at zero when scaling up)
    assert recommend(s, [16.0], active=2) == 2
    assert replica_value("in_flight", {"sglang:num_running_reqs": 3, "sglang:num_queue_reqs": 4}) == 7
    assert replica_value("kv_usage", {"sglang:token_usage": 0.4}) == 0.4


def test_stabilization_windows_and_cold_start():
    a = Autoscaler(_spec(target=10, scale_up_stabilization_s=10, scale_down_cooldown_s=20, cold_start_s=7), 0.0)
    launched, drained = a.decide(5.0, [30.0])  # the first recommendation (3) is its window's minimum: scale now
    assert [r.idx for r in launched] == [1, 2] and drained == []
    assert len(a.active()) == 3 and [r.ready_s for r in a.replicas[1:]] == [12.0, 12.0]  # 5 s + 7 s cold start
    assert a.counts(6.0) == {"replicas": 3.0, "replicas_ready": 1.0, "replicas_starting": 2.0, "replicas_draining": 0.0}
    a.decide(10.0, [0.0])  # demand gone: the cool-down keeps 3 while a recommendation of 3 is in its window
    assert len(a.active()) == 3
    a.decide(26.0, [0.0])  # 5 s is now 21 s back: the highest recommendation left is 1
    assert len(a.active()) == 1 and all(r.released_s == 26.0 for r in a.replicas[1:])


def test_scale_up_waits_for_the_stabilization_window():
    a = Autoscaler(_spec(target=10, scale_up_stabilization_s=10), 0.0)
    a.decide(0.0, [5.0])  # recommends 1
    a.decide(5.0, [40.0])  # recommends 4, but the window's minimum is still 1
    assert len(a.active()) == 1
    a.decide(15.0, [40.0])  # the 1 has left the window
    assert len(a.active()) == 4


def test_router_policies():
    reps = [Replica(i, 0.0, 0.0, outstanding=n) for i, n in enumerate([3, 1, 1])]
    lo = Router("least_outstanding")
    assert [lo.pick(reps).idx for _ in range(2)] == [1, 1]  # the fewest outstanding; ties in turn
    reps[1].outstanding = 5
    assert lo.pick(reps).idx == 2
    rr = Router("round_robin")
    assert [rr.pick(reps).idx for _ in range(4)] == [0, 1, 2, 0]


def _burst(rate: float, *, seed: int = 0) -> list[EmuRequest]:
    """2 req/s for 30 s, ``rate`` req/s for 30 s, 2 req/s for 90 s; 2000-token prompts, 300 tokens out."""
    rng = np.random.default_rng(seed)
    arr = np.sort(np.concatenate([rng.uniform(a, b, int((b - a) * r)) for a, b, r in
                                  [(0, 30, 2), (30, 60, rate), (60, 150, 2)]]))
    return [EmuRequest(f"r{i}", 2000, 300, [], 64, float(a)) for i, a in enumerate(arr)]


def test_fleet_scales_up_after_decision_and_cold_start_then_releases():
    s = _spec()
    res = simulate_fleet(lambda i: core(seed=i), _burst(30.0), s, start_s=0.0)
    ups = [e for e in res.events if e["kind"] == "scale_up"]
    downs = [e for e in res.events if e["kind"] == "scale_down"]
    # the burst starts at 30 s; the first decision after it (35 s) launches, the replicas serve 10 s later
    assert ups[0]["t"] == 35.0 and ups[0]["ready_s"] == 45.0 and ups[0]["to"] > 1
    launched = [r for r in res.replicas if r.idx in ups[0]["replicas"]]
    assert all(r.ready_s == 45.0 for r in launched)
    rows = {row["t"]: row for row in res.timeseries}
    assert rows[44.0]["replicas_ready"] == 1 and rows[44.0]["replicas"] == ups[0]["to"]  # held while cold
    assert rows[45.0]["replicas_ready"] == ups[0]["to"]
    # the new replicas really serve: requests routed after 45 s land on them and meet a tight TTFT
    late = [r for r in res.requests if 46 <= r.arrival_s < 60]
    assert max(r.ttft_s for r in late) < 0.5
    # misses concentrate in the burst before the replicas are ready
    early = [r for r in res.requests if 35 <= r.arrival_s < 45]
    calm = [r for r in res.requests if r.arrival_s < 30 or r.arrival_s >= 60]
    assert np.median([r.ttft_s for r in early]) > 2.0 and max(r.ttft_s for r in calm) < 0.5
    # after the burst the cool-down (20 s) passes, then the fleet goes back to one replica
    assert downs and downs[0]["t"] >= 60 + s.scale_down_cooldown_s
    assert res.timeseries[-1]["replicas"] == 1
    # every other replica was drained and released once its last request finished; which one stays is the
    # policy's choice at that decision (the busiest serving replica), not necessarily replica 0
    kept = [r for r in res.replicas if r.released_s is None]
    assert len(kept) == 1 and kept[0].drain_s is None
    assert all(r.released_s >= max(r.drain_s, r.last_finish_s) for r in res.replicas if r is not kept[0])
    # GPU-seconds: the replicas' lifetimes equal the integral of the reported replica count
    t = np.array([row["t"] for row in res.timeseries] + [res.end_s - res.start_s])
    held = np.array([row["replicas"] for row in res.timeseries])
    assert float(np.sum(held * np.diff(t))) == pytest.approx(res.replica_seconds(), rel=1e-9)
    assert res.replica_seconds() == pytest.approx(sum(min(r.released_s or res.end_s, res.end_s) - r.launched_s
                                                      for r in res.replicas))
    assert sorted(r.rid for r in res.requests) == sorted(r.rid for r in _burst(30.0))
    assert all(r.status == "ok" for r in res.requests)


def test_fleet_without_a_burst_stays_at_min_replicas():
    reqs = [EmuRequest(r.rid, r.prompt_tokens, r.output_tokens, [], 64, r.arrival_s + 100.0) for r in _burst(2.0)]
    res = simulate_fleet(lambda i: core(seed=i), reqs, _spec(min_replicas=2), start_s=100.0)
    assert res.events == [] and {row["replicas"] for row in res.timeseries} == {2.0}
    assert res.replica_seconds() == pytest.approx(2 * (res.end_s - 100.0))
