"""Interpolated capacity: the rate where the SLA's measured/bound ratio crosses 1, from the search's probes."""
import re

import numpy as np
import pytest

from autoresearch_dagster.loadgen.records import RequestRecord, StepOutcome
from autoresearch_dagster.measure.capacity import find_capacity, interpolate_crossing
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.spec import SLA

from ..loadgen.helpers import make_pool

SLA_SPEC = SLA.parse("ttft_p99<=500ms,tpot_p99<=50ms,errors<=1%")
POOL = make_pool([f"q{i}" for i in range(50)], output_tokens=10)


class SmoothDeployment:
    """Virtual-time deployment whose TTFT rises smoothly with the nominal step rate: 500 ms exactly at `knee`.

    TTFT = 100 ms + 400 ms x (rate / knee)^3, the same for every request, so the true SLA crossing is `knee`.
    The nominal rate is read from the step id (RUNNER names capacity steps by it), so the crossing does
    not move with the Poisson draw of the schedule.
    """

    def __init__(self, knee: float) -> None:
        self.knee = knee

    def run_step(self, schedule, *, step_id, timeout_s):
        rate = float(re.search(r"-([0-9.]+)rps$", step_id).group(1))
        ttft = 0.1 + 0.4 * (rate / self.knee) ** 3
        recs = [RequestRecord(request_id=s.request_id, step_id=step_id, scheduled_s=s.send_offset_s,
                              sent_s=s.send_offset_s, first_token_s=s.send_offset_s + ttft,
                              end_s=s.send_offset_s + ttft + 0.02 * 9, ttft_s=ttft, itl_s=[0.02] * 9,
                              e2e_s=ttft + 0.18, prompt_tokens=10, output_tokens=10, status="ok")
                for s in schedule]
        return StepOutcome(step_id=step_id, records=recs, duration_s=max(r.end_s for r in recs))

    def flush_cache(self):
        return True


def _search(knee: float, resolution: float):
    s = CapacitySettings(step_duration_s=20, min_completed=40, start_rps=2.0, resolution=resolution, warmup_s=0)
    return find_capacity(SmoothDeployment(knee), POOL, SLA_SPEC, gpus=1, model="m", settings=s, seed=3)


@pytest.mark.parametrize("knee", [13.7, 37.0])
def test_interpolated_capacity_lands_on_the_true_crossing_at_coarse_resolution(knee):
    res = _search(knee, resolution=0.10)
    assert res.valid, res.invalid_reasons
    assert res.capacity_interp_rps == pytest.approx(knee, rel=0.01)
    # the search's own value is only bracketed to the 10% resolution, and lies below the knee
    assert knee * 0.88 <= res.capacity_rps <= knee
    assert abs(res.capacity_interp_rps - knee) < abs(res.capacity_rps - knee) or res.capacity_rps == pytest.approx(knee)
    assert res.to_dict()["capacity_interp_rps"] == res.capacity_interp_rps
    ratios = [st.sla_ratio for st in res.steps]
    assert all(r is not None for r in ratios)
    assert all((r <= 1) == st.meets_sla for r, st in zip(ratios, res.steps))


def test_interpolated_capacity_is_monotone_in_the_true_knee():
    knees = [20.0, 20.4, 21.0, 22.5, 24.0, 26.0]
    est = [_search(k, resolution=0.10).capacity_interp_rps for k in knees]
    assert all(b > a for a, b in zip(est, est[1:])), est
    assert all(e == pytest.approx(k, rel=0.01) for e, k in zip(est, knees))


def test_interpolate_crossing_edge_cases():
    assert interpolate_crossing([]) is None
    assert interpolate_crossing([(10.0, 0.5, True), (20.0, 0.8, True)]) is None  # never crossed
    assert interpolate_crossing([(10.0, 2.0, False)]) is None  # nothing passed
    # two probes: log-log interpolation between the highest pass and the lowest failure above it
    est = interpolate_crossing([(10.0, 0.5, True), (20.0, 2.0, False)])
    assert est == pytest.approx(np.sqrt(200.0))
    # a failure the ratio does not show (queue growth) caps the estimate at its rate
    assert interpolate_crossing([(10.0, 0.5, True), (12.0, 0.9, False), (20.0, 2.0, False)]) == pytest.approx(12.0)
    assert interpolate_crossing([(10.0, 0.5, True), (12.0, 0.9, False)]) == pytest.approx(10.0)
    # a noisy non-monotone knee: a fit over the nearby probes, kept inside their span
    pts = [(20.0, 0.80, True), (22.0, 0.97, True), (22.5, 1.03, False), (23.0, 0.99, True), (24.0, 1.10, False)]
    est = interpolate_crossing(pts)
    assert 22.0 <= est <= 24.0


def test_a_cliff_keeps_the_estimate_inside_the_last_bracket():
    # TTFT jumps 100x between 10.0 and 10.1 req/s: no slope to fit, the two-point crossing is used
    pts = [(r, 0.05 if r <= 10.0 else 5.0, r <= 10.0) for r in (8.0, 9.0, 9.5, 9.8, 10.0, 10.1, 10.5, 11.0, 12.0)]
    est = interpolate_crossing(pts)
    assert 10.0 <= est <= 10.1


def test_a_lucky_pass_above_the_knee_does_not_pin_the_estimate_to_that_probe():
    # the ratio follows (rate / 23.7)^2, but the probe at 24.0 passed by luck (0.99) and bisection then
    # only probed above it: the fit's root lies below every probe, and is used (within 5%), not clamped to 24.0
    knee = 23.7
    pts = [(16.0, (16.0 / knee) ** 2, True), (32.0, (32.0 / knee) ** 2, False), (24.0, 0.99, True)]
    pts += [(r, (r / knee) ** 2, False) for r in (28.0, 26.0, 25.0, 24.5, 24.25, 24.125)]
    est = interpolate_crossing(pts)
    assert est < 24.0
    assert est == pytest.approx(knee, rel=0.01)
    assert interpolate_crossing(pts, max_extrapolation=0.0) == pytest.approx(24.0)  # the old clamp


def test_a_pass_its_confirmation_refuted_is_not_the_highest_pass():
    # vLLM's CPU build at max_num_seqs 4 (out/real-engine, 20 s steps): queueing behind 4 slots, a lucky pass at
    # 3.0 req/s that its confirmation refuted, failures at 2.25 and 2.5, the confirmed capacity 2.0
    pts = [(2.0, 0.92, True), (4.0, 11.67, False), (3.0, 0.59, True), (3.5, 7.50, False), (3.25, 8.24, False),
           (3.125, 2.86, False), (3.0, 6.60, False), (2.5, 5.07, False), (2.25, 2.67, False), (2.0, 0.98, True)]
    est = interpolate_crossing(pts)
    assert 2.0 <= est < 2.25
    assert interpolate_crossing([p for p in pts if p != (3.0, 6.60, False)]) > 3.0  # unrefuted, the pass stands
    near_miss = [(3.0, 1.1, False) if p == (3.0, 6.60, False) else p for p in pts]
    assert interpolate_crossing(near_miss) > 3.0  # a coin toss at the knee does not refute the pass


def _outcome(window_s: float, e2e_s: float, n: int = 50) -> StepOutcome:
    recs = [RequestRecord(request_id=f"r{i}", step_id="s", scheduled_s=i * window_s / (n - 1),
                          sent_s=i * window_s / (n - 1), first_token_s=i * window_s / (n - 1) + 0.1,
                          end_s=i * window_s / (n - 1) + e2e_s, ttft_s=0.1, itl_s=[0.01], e2e_s=e2e_s,
                          prompt_tokens=10, output_tokens=2, status="ok") for i in range(n)]
    return StepOutcome(step_id="s", records=recs, duration_s=window_s + e2e_s)


def test_a_hold_shorter_than_ten_mean_latencies_is_flagged():
    from autoresearch_dagster.measure.capacity import hold_warning
    warning = hold_warning(_outcome(60.0, 8.0))
    assert warning and "60 s" in warning and "8.0 s" in warning and "optimistic" in warning
    assert hold_warning(_outcome(120.0, 8.0)) is None
    # the smooth test deployment answers in 0.3 s against 20 s steps: no caveat on its search
    assert _search(20.0, resolution=0.10).warnings == []


class SlowAnswers(SmoothDeployment):
    """The smooth deployment, answering after 4 s: 10 mean latencies are 40 s, twice the 20 s steps."""

    def run_step(self, schedule, *, step_id, timeout_s):
        out = super().run_step(schedule, step_id=step_id, timeout_s=timeout_s)
        for r in out.records:
            r.end_s, r.e2e_s = r.end_s + 4.0, r.e2e_s + 4.0
        return out


def test_hold_e2e_multiple_lengthens_the_steps_after_the_first_pass_and_clears_the_caveat():
    s = CapacitySettings(step_duration_s=20, min_completed=40, start_rps=2.0, resolution=0.10, warmup_s=0)
    sla = SLA.parse("ttft_p99<=500ms,errors<=1%")  # the slow tail is decode time, outside this SLA
    fixed = find_capacity(SlowAnswers(20.0), POOL, sla, gpus=1, model="m", settings=s, seed=3)
    assert fixed.warnings and "--hold-e2e-multiple" in fixed.warnings[0]
    s.hold_e2e_multiple = 10.0
    held = find_capacity(SlowAnswers(20.0), POOL, sla, gpus=1, model="m", settings=s, seed=3)
    spans = [o.records[-1].scheduled_s - o.records[0].scheduled_s for o in held.outcomes]
    assert spans[0] < 25.0  # nothing passed yet: the fixed hold
    assert all(span >= 50.0 for span in spans[1:])  # >= 4.2 s mean E2E x 10 x 1.25 after the first pass
    assert held.warnings == [] and held.capacity_interp_rps == pytest.approx(20.0, rel=0.01)
