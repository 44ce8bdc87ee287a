"""Calibration recovers known efficiency factors from another emulator configuration's load curve."""
from __future__ import annotations

import pytest

from autoresearch_dagster.emulator.calibrate import (
    CurvePoint, calibrate, curve_points, infer_arrivals, measured_arrivals, predict, replay_measured)
from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.spec import SpecError

from .helpers import capacity, endpoint, pool

TRUTH = Efficiency(gemm_mfu=0.45, mbu=0.6, step_overhead_s=0.002)


def _measured(ep, p):
    points = [CurvePoint(rate, {}, duration_s=20.0, seed=i) for i, rate in enumerate((1.0, 4.0, 8.0))]
    return curve_points(predict(ep, {}, p, points, TRUTH), duration_s=20.0)


def test_calibration_recovers_known_factors():
    ep = endpoint(model="llama-3.1-8b", gpu_name="H100", sla="ttft_p99<=5000ms,tpot_p99<=200ms")
    p = pool(n=300, prompt_median=2500, prompt_sigma=0.3, output_median=80, output_sigma=0.3, seed=11)
    measured = _measured(ep, p)
    res = calibrate(ep, {}, p, measured, start=Efficiency(step_overhead_s=TRUTH.step_overhead_s), max_evals=40)
    assert res.params["mbu"] == pytest.approx(0.6, rel=0.1)
    assert res.params["gemm_mfu"] == pytest.approx(0.45, rel=0.15)
    assert max(res.error.values()) < 0.05
    assert max(res.initial_error.values()) > 0.15  # the defaults were visibly off before fitting


def test_calibration_rejects_unknown_factors_and_empty_curves():
    ep = endpoint()
    with pytest.raises(SpecError, match="cannot calibrate"):
        calibrate(ep, {}, pool(n=10), [CurvePoint(1.0, {"ttft_ms": {"p50": 100.0}})], params=("warp_speed",))
    with pytest.raises(SpecError, match="at least one"):
        calibrate(ep, {}, pool(n=10), [])


def test_curve_points_read_load_steps_and_lake_rows():
    lake_row = {"kind": "capacity", "rate_rps": 3.0, "ttft_p50_ms": 120.0, "ttft_p95_ms": 300.0, "ttft_p99_ms": None,
                "tpot_p50_ms": 20.0, "valid": True, "duration_s": 60.0}
    nested = {"kind": "capacity", "rate_rps": 5.0, "n_ok": 10, "ttft_ms": {"p50": 150.0}, "duration_s": 30.0}
    skipped = [{"kind": "warmup", "rate_rps": 1.0, "ttft_p50_ms": 1.0}, {"kind": "capacity", "rate_rps": 2.0, "valid": False,
                                                                        "ttft_p50_ms": 1.0}]
    pts = curve_points([lake_row, nested, *skipped])
    assert [p.rate_rps for p in pts] == [3.0, 5.0]
    assert pts[0].metrics["ttft_ms"]["p95"] == 300.0 and pts[0].metrics["tpot_ms"]["p50"] == 20.0
    assert pts[1].metrics["ttft_ms"] == {"p50": 150.0} and pts[1].duration_s == 30.0


def test_every_efficiency_factor_has_fit_bounds_around_its_default():
    from dataclasses import fields

    from autoresearch_dagster.emulator.calibrate import BOUNDS, fittable

    names = [f.name for f in fields(Efficiency)]
    assert set(BOUNDS) == set(names) and list(fittable()) == names
    for f in fields(Efficiency):
        lo, hi = BOUNDS[f.name]
        assert 0 < lo < f.default < hi, f"{f.name}: default {f.default} outside its bounds ({lo}, {hi})"
        if f.name == "moe_n_half":  # a width in GEMM columns
            assert hi >= 4096, "moe_n_half must reach past the widest per-rank expert"
        elif not f.name.endswith("_s"):
            assert hi <= 1.0, f"{f.name} is a fraction of peak"


def test_calibration_fits_the_fixed_request_latency_by_name():
    """A factor eb9b54c added is fittable by name: the frontend's fixed latency shows in TTFT at low load."""
    ep = endpoint(model="llama-3.1-8b", gpu_name="H100", sla="ttft_p99<=5000ms,tpot_p99<=200ms")
    p = pool(n=120, prompt_median=400, prompt_sigma=0.3, output_median=40, output_sigma=0.3, seed=3)
    truth = Efficiency(request_in_s=0.06)
    points = [CurvePoint(1.0, {}, duration_s=20.0, seed=0)]
    measured = curve_points(predict(ep, {}, p, points, truth), duration_s=20.0)
    res = calibrate(ep, {}, p, measured, params=("request_in_s",), metrics=(("ttft_ms", "p50"),), max_evals=20)
    assert res.params["request_in_s"] == pytest.approx(0.06, rel=0.1)
    assert res.initial_error["ttft_ms.p50"] > 0.2 > 0.02 > res.error["ttft_ms.p50"]


def test_a_measured_step_is_replayed_for_its_send_window_not_its_drain():
    """A loaded step's ``duration_s`` runs on until its last response; replaying its rate that long overloads the
    emulator where the engine was not (the 8 req/s step of the vLLM baseline: 20 s of sends, 41 s in all)."""
    ep = endpoint(model="llama-3.1-8b", gpu_name="H100", sla="ttft_p99<=5000ms,tpot_p99<=200ms")
    p = pool(n=300, prompt_median=2500, prompt_sigma=0.3, output_median=400, output_sigma=0.3, seed=11)
    steps = [s.to_dict() for s in predict(ep, {}, p, [CurvePoint(8.0, {}, duration_s=20.0, seed=0)], TRUTH)]
    assert steps[0]["duration_s"] > 22.0  # the drain: the last sends finish well after the window
    (pt,) = curve_points(steps)
    assert pt.duration_s == pytest.approx(20.0, rel=0.1)
    lake_row = {"kind": "capacity", "rate_rps": 4.0, "offered_rps": 4.2, "n_sent": 85, "duration_s": 31.0,
                "ttft_p50_ms": 50.0, "valid": True}
    old_row = {k: v for k, v in lake_row.items() if k != "n_sent"}  # written before the lake kept n_sent
    assert curve_points([lake_row])[0].duration_s == pytest.approx(84 / 4.2)
    assert curve_points([old_row])[0].duration_s == 31.0


def test_restarts_leave_a_fit_that_stopped_far_from_the_curve():
    """From a start far off (cheap prefill bound, decode at full bandwidth) a short local fit stays far from the
    curve; quasi-random restarts inside the bounds find the factors that made it."""
    ep = endpoint(model="llama-3.1-8b", gpu_name="H100", sla="ttft_p99<=5000ms,tpot_p99<=200ms")
    p = pool(n=300, prompt_median=2500, prompt_sigma=0.3, output_median=80, output_sigma=0.3, seed=11)
    measured = _measured(ep, p)
    far = Efficiency(gemm_mfu=0.051, mbu=0.99, step_overhead_s=TRUTH.step_overhead_s)
    stuck = calibrate(ep, {}, p, measured, start=far, max_evals=3)
    found = calibrate(ep, {}, p, measured, start=far, max_evals=3, restarts=4)
    assert max(stuck.error.values()) > 0.2 and max(found.error.values()) < 0.1
    assert found.params["mbu"] == pytest.approx(0.6, rel=0.1) and found.n_evals > stuck.n_evals


def test_a_measured_search_step_is_replayed_with_its_own_sends():
    """A search step records how its sends were drawn; the calibration replays those sends and pool rows, not a
    fresh draw (20-30 requests at a low rate: the realized rate and the heavy-tailed outputs differ per draw)."""
    sla = "ttft_p99<=5000ms,tpot_p99<=200ms"
    p = pool(n=300, prompt_median=500, prompt_sigma=0.5, output_median=60, output_sigma=0.8, seed=3)
    res = capacity({}, p, sla=sla, model="llama-3.1-8b", gpu_name="H100", seed=7)
    steps = [s.to_dict() for s in res.steps]
    assert [s["arrival_seed"] for s in steps] == [7000 + k for k in range(len(steps))]
    assert [s["start_index"] for s in steps] == [sum(x["n_sent"] for x in steps[:k]) for k in range(len(steps))]
    kept = [s for s in steps if s["kind"] != "warmup" and s["valid"] and s["n_ok"]]
    pts = curve_points(kept)
    assert len(pts) == len(kept) >= 3
    assert all(pt.offsets is not None and len(pt.offsets) == s["n_sent"] for pt, s in zip(pts, kept))
    ep = endpoint(model="llama-3.1-8b", gpu_name="H100", sla=sla)
    replayed = predict(ep, {}, p, pts, Efficiency())
    # the emulator under its own default factors is the engine that measured them: the replay is the same load
    for st, got in zip(kept, replayed):
        assert got.n_sent == st["n_sent"] and got.offered_rps == pytest.approx(st["offered_rps"], rel=1e-9)
        assert got.ttft_ms["p50"] == pytest.approx(st["ttft_ms"]["p50"], rel=0.02)
    # a record whose redraw does not give its offered rate is not trusted: a fresh draw at its rate instead
    assert measured_arrivals({**steps[2], "offered_rps": steps[2]["offered_rps"] * 1.01}) is None


def test_arrivals_of_a_search_written_before_they_were_recorded_are_inferred():
    p = pool(n=300, prompt_median=500, prompt_sigma=0.5, output_median=60, seed=3)
    res = capacity({}, p, sla="ttft_p99<=5000ms,tpot_p99<=200ms", model="llama-3.1-8b", gpu_name="H100", seed=12)
    steps = [s.to_dict() for s in res.steps]
    old = [{k: v for k, v in s.items() if k not in ("arrival_seed", "start_index", "burstiness")} for s in steps]
    back = infer_arrivals(old)
    assert [(s["arrival_seed"], s["start_index"]) for s in back] == [(s["arrival_seed"], s["start_index"]) for s in steps]
    shuffled = [old[0], *old[2:], old[1]]  # not the order the search ran: no run seed reproduces it
    assert infer_arrivals(shuffled) == shuffled


def test_replaying_a_measured_search_step_by_step():
    sla = "ttft_p99<=5000ms,tpot_p99<=200ms"
    p = pool(n=300, prompt_median=500, prompt_sigma=0.5, output_median=60, output_sigma=0.8, seed=3)
    steps = [s.to_dict() for s in capacity({}, p, sla=sla, model="llama-3.1-8b", gpu_name="H100", seed=5).steps]
    ep = endpoint(model="llama-3.1-8b", gpu_name="H100", sla=sla)
    same = replay_measured(ep, {}, steps, p, Efficiency())
    assert [s["step_id"] for s, _ in same] == [s["step_id"] for s in steps if s["kind"] != "warmup"]
    assert all(st.n_sent == s["n_sent"] and st.passed == s["passed"] for s, st in same)
    slow = replay_measured(ep, {}, steps, p, Efficiency(mbu=0.3, step_overhead_s=0.004))
    assert all(st.tpot_ms["p50"] > 1.3 * s["tpot_ms"]["p50"] for s, st in slow)


def test_a_prior_holds_the_factors_toward_their_start_and_is_not_counted_as_error():
    """prior_weight puts a Gaussian prior on the log-factors around the start: a weak one leaves a well-measured
    factor where the data put it, a strong one pulls it toward the start; the reported error is the data's alone."""
    ep = endpoint(model="llama-3.1-8b", gpu_name="H100", sla="ttft_p99<=5000ms,tpot_p99<=200ms")
    p = pool(n=120, prompt_median=400, prompt_sigma=0.3, output_median=40, output_sigma=0.3, seed=3)
    points = [CurvePoint(1.0, {}, duration_s=20.0, seed=0)]
    measured = curve_points(predict(ep, {}, p, points, Efficiency(request_in_s=0.06)), duration_s=20.0)
    fit = dict(params=("request_in_s",), metrics=(("ttft_ms", "p50"),), max_evals=20)
    free = calibrate(ep, {}, p, measured, **fit)
    weak = calibrate(ep, {}, p, measured, prior_weight=0.1, **fit)
    strong = calibrate(ep, {}, p, measured, prior_weight=3.0, **fit)
    start = Efficiency().request_in_s
    assert weak.params["request_in_s"] == pytest.approx(free.params["request_in_s"], rel=0.1)
    assert start < strong.params["request_in_s"] < 0.8 * free.params["request_in_s"]
    assert strong.error["ttft_ms.p50"] > weak.error["ttft_ms.p50"]  # the data's miss, not the prior's term
    assert set(strong.error) == {"ttft_ms.p50"}
