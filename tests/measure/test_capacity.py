"""Capacity search on a synthetic deployment with a known knee."""
import math

import numpy as np
import pytest

from autoresearch_dagster.measure.capacity import find_capacity, grow_bisect, linear_ramp_steps, no_pass_reason
from autoresearch_dagster.measure.profiles import WARM_GROWTH, WARM_RESOLUTION, CapacitySettings
from autoresearch_dagster.spec import SLA

from ..loadgen.helpers import make_pool
from .helpers import KneeDeployment

SLA_SPEC = SLA.parse("ttft_p99<=500ms,tpot_p99<=50ms,errors<=1%")


POOL = make_pool([f"q{i}" for i in range(50)], output_tokens=10)


def test_capacity_found_within_resolution_in_fewer_steps_than_a_linear_ramp():
    dep = KneeDeployment(knee=37.0)
    s = CapacitySettings(step_duration_s=120, min_completed=200, start_rps=2.0, resolution=0.05, warmup_s=5)
    res = find_capacity(dep, POOL, SLA_SPEC, gpus=2, model="m", settings=s, seed=1)
    assert res.valid, res.invalid_reasons
    assert 37.0 * 0.90 <= res.capacity_rps <= 37.0 * 1.04  # resolution + Poisson noise of the offered rate
    assert res.capacity_rps_per_gpu == pytest.approx(res.capacity_rps / 2)
    measured = [st for st in res.steps if st.kind != "warmup"]
    assert res.steps[0].kind == "warmup" and measured[-1].kind == "confirm" and measured[-1].passed
    assert dep.flushes == len(res.steps)  # a prefix-cache flush before every step, warm-up included
    assert len(measured) < linear_ramp_steps(res.capacity_rps, start=2.0, resolution=0.05)
    assert all(st.n_sent >= 200 for st in measured)  # duration extended to reach the minimum count
    failing = [st for st in measured if not st.passed]
    assert failing and all(st.rate_rps > res.capacity_rps for st in failing)


def test_invalid_steps_never_count_as_passing():
    dep = KneeDeployment(knee=40.0, invalid_above=20.0)
    s = CapacitySettings(step_duration_s=60, min_completed=50, start_rps=5.0, resolution=0.1, warmup_s=0)
    res = find_capacity(dep, POOL, SLA_SPEC, gpus=1, model="m", settings=s)
    assert res.capacity_rps <= 20.0 * 1.05
    assert not res.valid and any("send lag" in r for r in res.invalid_reasons)


def test_grow_bisect_counts_and_confirm_failure():
    calls = []

    def probe(x, kind):
        calls.append((x, kind))
        return x <= 100.0

    value, used = grow_bisect(probe, start=1.0, growth=2.0, resolution=0.02, max_steps=30)
    assert 98.0 <= value <= 100.0 and used == len(calls) and calls[-1][1] == "confirm"
    assert used < linear_ramp_steps(100.0, start=1.0, resolution=0.02) / 3

    flaky = {"n": 0}

    def probe2(x, kind):  # the first confirmation fails (noise near the knee)
        if kind == "confirm" and flaky["n"] == 0:
            flaky["n"] += 1
            return False
        return x <= 10.0

    value2, _ = grow_bisect(probe2, start=1.0, growth=2.0, resolution=0.05, max_steps=30)
    assert 8.0 <= value2 < 10.0  # settles below the point that failed its confirmation
    assert grow_bisect(lambda x, k: False, start=1.0, growth=2.0, resolution=0.05, max_steps=30)[0] == 0.0


def test_grow_bisect_keeps_steps_to_confirm_when_the_knee_is_a_coin_toss():
    rng = np.random.default_rng(7)
    unconfirmed = 0
    for _ in range(300):
        last = []

        def probe(x, kind):  # pass/fail near the knee at 22 is noisy: ~5% of rate per probe
            ok = math.log(x / 22.0) + rng.normal(0, 0.05) < 0
            last[:] = [kind, ok]
            return ok

        value, used = grow_bisect(probe, start=16.0, growth=2.0, resolution=0.01, max_steps=20)
        assert used <= 20
        unconfirmed += last != ["confirm", True]
    assert unconfirmed <= 3  # before the confirmation reserve ~3% of such searches ended unconfirmed


def test_a_search_out_of_steps_before_any_pass_is_invalid_not_capacity_0():
    dep = KneeDeployment(knee=0.01)  # nothing the search tries meets the SLA
    s = CapacitySettings(step_duration_s=20, min_completed=5, start_rps=8.0, resolution=0.1, warmup_s=0, max_steps=3)
    res = find_capacity(dep, POOL, SLA_SPEC, gpus=1, model="m", settings=s)
    assert res.capacity_rps == 0.0 and not res.valid
    assert res.invalid_reasons == ["the search ran out of its 3 steps before any step met the SLA (lowest tried 2 "
                                   "req/s; the floor is 0.125): no value was found"]
    assert res.to_dict()["valid"] is False


def test_a_search_that_reaches_its_floor_keeps_its_0_with_a_caveat():
    dep = KneeDeployment(knee=0.01)
    s = CapacitySettings(step_duration_s=20, min_completed=5, start_rps=8.0, resolution=0.1, warmup_s=0, max_steps=20)
    res = find_capacity(dep, POOL, SLA_SPEC, gpus=1, model="m", settings=s)
    assert res.capacity_rps == 0.0 and res.valid, res.invalid_reasons
    assert len(res.steps) == 7 and res.warnings == ["no step met the SLA, down to 0.125 req/s (the search's floor): "
                                                    "the value is 0"]


def test_capacity_settings_are_checked_where_they_are_declared():
    from autoresearch_dagster.spec import SpecError

    for bad in ({"resolution": 0.0}, {"growth": 1.0}, {"max_steps": 0}, {"start_rps": -1.0},
                {"step_duration_s": float("nan")}):
        with pytest.raises(SpecError, match=f"measurement setting {next(iter(bad))} = "):
            CapacitySettings(**bad)


def _counting(limit: float):
    calls: list[tuple[float, str]] = []

    def probe(x, kind):
        calls.append((x, kind))
        return x <= limit

    return probe, calls


def test_a_warm_start_brackets_the_value_in_a_few_probes_and_still_reaches_a_far_one():
    cold, cold_calls = _counting(15.6)
    value, used = grow_bisect(cold, start=1.0, growth=2.0, resolution=0.03, max_steps=20)
    near, near_calls = _counting(15.6)
    warm_value, warm_used = grow_bisect(near, start=15.0, growth=1.05, resolution=0.03, max_steps=20, accelerate=True)
    assert near_calls[:2] == [(15.0, "capacity"), (15.75, "capacity")]  # the estimate, then one small move
    assert 15.0 <= warm_value <= 15.6 and near_calls[-1] == (warm_value, "confirm")
    assert warm_used <= 4 and warm_used < used  # 15, 15.75 (fail), 15.375, confirm
    # twice the estimate: each move is one factor larger (x1.05, x1.05^2, x1.05^3, ...), capped at x2 per move
    far, far_calls = _counting(30.0)
    far_value, far_used = grow_bisect(far, start=15.0, growth=1.05, resolution=0.03, max_steps=20, accelerate=True)
    rates = [x for x, k in far_calls[:5]]
    assert rates[:4] == pytest.approx([15.0, 15.75, 17.364, 20.101], rel=1e-3)
    assert 29.1 <= far_value <= 30.0 and far_used <= 10
    low, _ = _counting(4.0)  # far below the estimate: the shrinking moves grow the same way
    assert 3.88 <= grow_bisect(low, start=15.0, growth=1.05, resolution=0.03, max_steps=20, accelerate=True)[0] <= 4.0


def test_a_warm_search_that_finds_nothing_stops_at_the_same_floor_a_doubling_search_would():
    probe, calls = _counting(0.0)
    assert grow_bisect(probe, start=16.0, growth=1.05, resolution=0.03, max_steps=40, accelerate=True)[0] == 0.0
    assert min(x for x, _ in calls) == pytest.approx(16.0 / 2 ** 6)
    reason, caveat = no_pass_reason([(x, False) for x, _ in calls], start=16.0, growth=1.05, max_steps=40,
                                    accelerate=True)
    assert reason is None and "down to 0.25 req/s" in caveat


def test_warmed_settings_start_at_the_estimate_and_stop_bisecting_earlier_only_for_the_interpolated_estimator():
    s = CapacitySettings(start_rps=1.0, resolution=0.01)
    w = s.warmed(15.0)
    assert (w.start_rps, w.growth, w.warm_start, w.resolution) == (15.0, WARM_GROWTH, True, WARM_RESOLUTION)
    assert s.warmed(15.0, estimator="search").resolution == 0.01  # its value is the bracket: keep the resolution
    assert CapacitySettings(resolution=0.05).warmed(15.0).resolution == 0.05  # a coarser profile stays coarse
    assert s.warmed(0.0) is s and not s.warm_start
    dep = KneeDeployment(knee=37.0)
    res = find_capacity(dep, POOL, SLA_SPEC, gpus=1, model="m", seed=1,
                        settings=CapacitySettings(step_duration_s=60, min_completed=100, warmup_s=0,
                                                  resolution=0.01).warmed(36.0))
    assert res.valid and 37.0 * 0.93 <= res.capacity_rps <= 37.0 * 1.04
    assert res.steps[0].rate_rps == 36.0 and len(res.steps) <= 6
