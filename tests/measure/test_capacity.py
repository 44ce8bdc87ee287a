"""Capacity search on a synthetic deployment with a known knee."""
import math

import numpy as np
import pytest

from autoresearch_dagster.measure.capacity import find_capacity, grow_bisect, linear_ramp_steps
from autoresearch_dagster.measure.profiles import CapacitySettings
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
