"""The one load step (every step the measurement runs gets its profile's per-request timeout) and its statistics."""
import pytest

from autoresearch_dagster.loadgen.records import RequestRecord, StepOutcome
from autoresearch_dagster.measure.capacity import find_capacity
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.measure.shape import run_shape
from autoresearch_dagster.measure.step import poisson_step, run_offsets, step_offsets, summarize_step
from autoresearch_dagster.spec import SLA

from ..loadgen.helpers import make_pool
from .helpers import KneeDeployment

SLA_SPEC = SLA.parse("ttft_p99<=500ms,tpot_p99<=50ms,errors<=1%")
POOL = make_pool([f"q{i}" for i in range(50)], output_tokens=10)


class TimeoutLog(KneeDeployment):
    """Records the per-request timeout each step was sent with."""

    def __init__(self, knee: float) -> None:
        super().__init__(knee)
        self.timeouts: list[float] = []

    def run_step(self, schedule, *, step_id, timeout_s):
        self.timeouts.append(timeout_s)
        return super().run_step(schedule, step_id=step_id, timeout_s=timeout_s)


def test_the_search_and_the_shape_replay_send_every_step_with_the_profiles_timeout():
    dep = TimeoutLog(knee=20.0)
    s = CapacitySettings(step_duration_s=20, min_completed=40, start_rps=4.0, resolution=0.2, warmup_s=2,
                         request_timeout_s=77.0)
    find_capacity(dep, POOL, SLA_SPEC, gpus=1, model="m", settings=s, seed=0)
    run_shape(dep, POOL, SLA_SPEC, gpus=1, model="m", speedup=2.0, request_timeout_s=77.0)
    # a step's length never changes its timeout: warm-up, long and short steps all get 77 s
    assert len(dep.timeouts) >= 4 and set(dep.timeouts) == {77.0}


def test_poisson_step_holds_longer_until_it_sends_the_minimum():
    short = step_offsets(2.0, 5.0, seed=3)
    held = step_offsets(2.0, 5.0, seed=3, min_requests=40)
    assert len(held) >= 40 > len(short)
    run = poisson_step(TimeoutLog(knee=50.0), POOL, SLA_SPEC, rate_rps=2.0, duration_s=5.0, model="m", seed=3,
                       step_id="s", request_timeout_s=30.0, min_completed=40)
    assert len(run.schedule) == len(held) and run.step.n_sent == len(held)


def test_run_offsets_summarises_what_it_sent():
    dep = TimeoutLog(knee=50.0)
    run = run_offsets(dep, POOL, [0.0, 0.5, 1.0], SLA_SPEC, rate_rps=2.0, model="m", seed=0, step_id="w",
                      request_timeout_s=12.0, kind="warmup", flush_cache=True)
    assert dep.timeouts == [12.0] and dep.flushes == 1
    assert run.step.kind == "warmup" and run.step.n_ok == 3 and len(run.outcome.records) == 3


def test_summarize_step_quantiles_goodput_and_min_completed():
    recs = []
    for i in range(100):
        ttft = 0.1 if i < 95 else 2.0
        recs.append(RequestRecord(request_id=str(i), step_id="s", scheduled_s=i * 0.1, sent_s=i * 0.1,
                                  first_token_s=i * 0.1 + ttft, end_s=i * 0.1 + ttft + 0.3, ttft_s=ttft,
                                  itl_s=[0.1, 0.1, 0.1], e2e_s=ttft + 0.3, prompt_tokens=5, output_tokens=4,
                                  status="ok"))
    out = StepOutcome(step_id="s", records=recs, duration_s=12.0)
    st = summarize_step(out, SLA.parse("ttft_p99<=500ms"), rate_rps=10.0)
    assert st.ttft_ms["p50"] == pytest.approx(100.0) and st.ttft_ms["p99"] > 500
    assert not st.meets_sla and st.valid and st.failed_terms[0].startswith("ttft_p99")
    assert st.tpot_ms["p50"] == pytest.approx(100.0)
    assert st.offered_rps == pytest.approx(10.0) and st.achieved_rps == pytest.approx(10.0, rel=0.05)
    assert st.goodput_rps == pytest.approx(st.achieved_rps * 0.95)
    assert st.goodput_rps < st.achieved_rps
    assert st.sla_attainment == pytest.approx(0.95) and not st.queue_growth
    ok_sla = summarize_step(out, SLA.parse("ttft_p95<=500ms"), rate_rps=10.0, min_completed=500)
    assert ok_sla.meets_sla and not ok_sla.valid and "minimum" in ok_sla.invalid_reasons[0]


def test_queue_growth_detected_when_completions_lag_arrivals():
    def step(service_gap):
        recs, free = [], 0.0
        for i in range(400):  # arrivals at 10/s into a FIFO server with fixed service time
            arr = i * 0.1
            start = max(arr, free)
            free = start + service_gap
            recs.append(RequestRecord(request_id=str(i), step_id="q", scheduled_s=arr, sent_s=arr,
                                      first_token_s=free, end_s=free, ttft_s=free - arr, itl_s=[],
                                      e2e_s=free - arr, prompt_tokens=1, output_tokens=1, status="ok"))
        return summarize_step(StepOutcome(step_id="q", records=recs, duration_s=free),
                              SLA.parse("e2e_p99<=100000ms"), rate_rps=10.0)
    assert step(0.12).queue_growth and not step(0.12).meets_sla  # served at 8.3/s < 10/s
    assert not step(0.08).queue_growth and step(0.08).meets_sla


def test_low_load_composition_change_is_not_queue_growth():
    # 2 req/s far below capacity: the second half's requests are long (in-flight rises from ~1 to
    # ~15) and decode slower (TPOT median 3.2 -> 8.2 ms, as measured on the demo at 2 req/s) because
    # long prefills land in their batches.
    # TTFT stays flat: nothing is queued, so this must not read as queue growth.
    recs = []
    for i in range(120):
        arr = i * 0.5
        long_ = arr >= 30
        n_out, tpot = (2000, 0.0082) if long_ else (100, 0.0032)
        ttft = 0.04
        e2e = ttft + tpot * (n_out - 1)
        recs.append(RequestRecord(request_id=str(i), step_id="c", scheduled_s=arr, sent_s=arr,
                                  first_token_s=arr + ttft, end_s=arr + e2e, ttft_s=ttft, itl_s=[tpot],
                                  e2e_s=e2e, prompt_tokens=100, output_tokens=n_out, status="ok"))
    st = summarize_step(StepOutcome(step_id="c", records=recs, duration_s=recs[-1].end_s),
                        SLA.parse("ttft_p99<=3000ms,tpot_p99<=60ms"), rate_rps=2.0)
    assert not st.queue_growth and st.meets_sla
