"""The shared-control procedure campaigns run: earlier baseline runs, anchors, drift, Bonferroni, futility."""
from __future__ import annotations

import numpy as np
import pytest

from autoresearch_dagster.experiments import stats
from autoresearch_dagster.experiments.experiment import SharedControl, run_experiment
from autoresearch_dagster.experiments.noise import measure_noise
from autoresearch_dagster.spec import Budget, EndpointSpec

from .helpers import FakeEngine
from .test_experiment import BASE, cap_of, settings


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from .helpers import make_pool

    return make_pool(tmp_path_factory.mktemp("pool"))


@pytest.fixture
def endpoint():
    return EndpointSpec(name="demo", model="m", hardware={"gpu": "H200", "count": 1},
                        sla="ttft_p99<=1000ms,errors<=1%", server_config={})


def _noise(endpoint, pool, engine):
    return measure_noise(endpoint, {}, pool, engine=engine, runs=5, settings=settings())


def test_the_baseline_arm_starts_from_the_noise_floor_and_adds_one_anchor_per_candidate_run(endpoint, pool):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.3}), noise_cv=0.01)
    noise = _noise(endpoint, pool, eng)
    res = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(confirm=False), noise_cv=noise.capacity_cv,
                         control=SharedControl(noise.runs), comparisons=3)
    assert res.verdict == "better" and not res.confirmed
    fresh = [r for r in res.runs if r.arm == "baseline"]
    assert len(fresh) == 5 and len([r for r in res.runs if r.arm == "candidate"]) == 5
    assert res.runs_baseline == 10  # 5 shared + 5 anchors
    assert res.stats.confidence == pytest.approx(1 - 0.10 / 3)  # Bonferroni for 3 candidates
    assert res.gpu_seconds == pytest.approx(sum(r.gpu_seconds for r in res.runs)) and res.gpu_seconds > 0
    assert res.to_dict()["shared_control_run_ids"] == [r.run_id for r in noise.runs if r.valid]


def test_a_drifted_baseline_drops_the_earlier_runs(endpoint, pool):
    eng = FakeEngine(cap_of({}), noise_cv=0.005)
    noise = _noise(endpoint, pool, eng)
    eng.capacity_of = lambda c: BASE * 0.8  # the endpoint slowed down since its noise floor
    res = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(confirm=False), noise_cv=noise.capacity_cv,
                         control=SharedControl(noise.runs), budget=Budget(initial_runs_per_arm=3,
                                                                          max_runs_per_arm=3))
    assert "drifted" in res.control_note and res.shared_runs == []
    assert res.verdict == "same"  # judged on fresh interleaved arms only: no false "worse"


def test_futility_stops_a_candidate_that_cannot_be_better(endpoint, pool):
    # 1% deployment noise: on this pass/fail cliff a warm search's 3% bracket adds about 0.7% of its own per run
    eng = FakeEngine(cap_of({}), noise_cv=0.01)
    noise = _noise(endpoint, pool, eng)
    kw = dict(engine=eng, noise_cv=noise.capacity_cv, control=SharedControl(noise.runs))
    fut = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool,
                         settings=settings(confirm=False, stop_when_not_better=True), **kw)
    full = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, settings=settings(confirm=False), **kw)
    assert fut.verdict == "same" and "futility" in fut.reason
    assert len(fut.runs) < len(full.runs)
    assert stats.futility_bound(fut.stats) < 1 + fut.stats.margin


def test_futility_never_stops_an_estimate_that_points_to_a_practical_loss():
    """An early stage's margin is inflated by the noise floor (about 5% at 5 runs): a candidate measured
    3.5% slower must keep its runs, or a true -5% loss ends as "same" half the time."""
    v = stats.verdict([10.0, 10.3, 9.7, 10.1, 9.9], [9.65, 9.9, 9.4, 9.7, 9.55], noise_cv=0.04)
    assert v.verdict in ("undecided", "same") and v.margin > 0.035
    assert stats.futility_bound(v) < 1 + v.margin and v.ratio_median < 1 - stats.MIN_MARGIN
    assert not stats.not_better(v)
    flat = stats.verdict([10.0, 10.3, 9.7, 10.1, 9.9], [9.95, 10.2, 9.6, 10.0, 9.85], noise_cv=0.04)
    assert stats.not_better(flat)  # no gain in sight and no loss either: stop
    # an estimate just inside the practical margin, on wide early intervals: a loss is still plausible, keep going
    edge = stats.verdict([10.0, 10.4, 9.6, 10.2, 9.8], [9.85, 10.2, 9.4, 10.05, 9.6], noise_cv=0.04)
    assert edge.ratio_median >= 1 - stats.MIN_MARGIN and stats.futility_bound(edge) < 1 + edge.margin
    assert stats.loss_guard_bound(edge) < 1 - stats.MIN_MARGIN and not stats.not_better(edge)


def test_a_promising_comparison_at_the_run_cap_is_extended_without_a_confirmation_stage(endpoint, pool):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.12}), noise_cv=0.05)
    noise = _noise(endpoint, pool, eng)
    res = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(confirm=False), noise_cv=noise.capacity_cv,
                         control=SharedControl(noise.runs), budget=Budget(initial_runs_per_arm=3,
                                                                          max_runs_per_arm=3))
    stages = [s["stage"] for s in res.stages]
    assert stages[0] == "n=3" and res.stages[0]["verdict"] == "undecided"
    assert abs(res.stages[0]["ratio_median"] - 1) >= res.stages[0]["margin"]  # promising at the cap
    assert stats.extension_schedule((3,)) == (6,)  # steps of the first stage, up to twice the cap
    assert stages[1] == "n=6 (extension: a decision within reach at the run cap)"
    assert len([r for r in res.runs if r.arm == "candidate"]) == 6
    assert res.verdict in ("better", "same") and len(stages) <= 3
    assert stats.extension_schedule((5, 10, 20)) == (25, 30, 35, 40)


def test_from_ten_baseline_runs_the_margin_takes_the_run_cv_from_the_baseline_arm(endpoint, pool):
    """The noise floor's 5 runs give the first stage's CV; once the arm (noise floor + anchors) holds 10 runs or
    more, their own CV sets the margin, so one lucky noise floor does not set the margin of the whole comparison."""
    eng = FakeEngine(cap_of({}), noise_cv=0.03)
    noise = _noise(endpoint, pool, eng)
    stated = 0.001  # far below what the runs show
    res = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(confirm=False), noise_cv=stated, control=SharedControl(noise.runs),
                         budget=Budget(initial_runs_per_arm=5, max_runs_per_arm=10))
    base = res.values("baseline")
    assert len(base) >= 10
    assert res.stats.noise_cv == pytest.approx(stats.run_cv(base)) and res.stats.noise_cv > 10 * stated
    assert res.noise_cv == stated  # the experiment still records the noise floor it was given


def test_runs_whose_capacity_is_estimated_start_their_search_there(endpoint, pool):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.3}), noise_cv=0.01)
    noise = _noise(endpoint, pool, eng)
    first = [r.steps[0]["rate_rps"] for r in noise.runs]
    assert first[0] == 1.0  # nothing known yet: the profile's low start, doubling
    assert first[1:] == [pytest.approx(noise.runs[0].value("capacity_interp_rps"))] * 4  # then the first run's
    assert max(len(r.steps) for r in noise.runs[1:]) < len(noise.runs[0].steps)
    res = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(confirm=False), noise_cv=noise.capacity_cv,
                         control=SharedControl(noise.runs), comparisons=3)
    median = float(np.median([r.value("capacity_interp_rps") for r in noise.runs]))
    anchors = [r for r in res.runs if r.arm == "baseline"]
    assert [r.steps[0]["rate_rps"] for r in anchors] == [pytest.approx(median)] * len(anchors)
    # the candidate's first run searches cold and alone; its others start at its own capacity so far, not the
    # baseline's (an estimate leans toward where its search started: capacity_start's doc)
    cand = [r for r in res.runs if r.arm == "candidate"]
    assert cand[0].steps[0]["rate_rps"] == 1.0 and res.runs.index(cand[1]) > res.runs.index(cand[0])
    assert len(cand) >= 5 and [r.steps[0]["rate_rps"] for r in cand[1:5]] == \
        [pytest.approx(cand[0].value("capacity_interp_rps"))] * 4
    assert res.verdict == "better" and 1.2 < res.stats.ratio_median < 1.4
    cold = run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, engine=eng,
                          settings=settings(confirm=False, warm_start=False), noise_cv=noise.capacity_cv,
                          control=SharedControl(noise.runs), comparisons=3)
    assert {r.steps[0]["rate_rps"] for r in cold.runs} == {1.0}
    assert sum(len(r.steps) for r in res.runs) < sum(len(r.steps) for r in cold.runs)
