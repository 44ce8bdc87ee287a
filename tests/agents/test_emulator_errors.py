"""The emulator error report: rows by knob family, the timeline, and the drift rule."""
import math

import pytest

from autoresearch_dagster.agents.emulator_errors import drift, error_report, error_row, families, to_markdown


def _row(i, knobs, emulated, measured, version=1):
    return error_row(experiment_id=f"e{i}", proposal_id=f"p{i}", campaign_id="c", round_no=1, era=0, knobs=knobs,
                     emulated_ratio=emulated, measured_ratio=measured, verdict="better", ci=(None, None),
                     calibration_version=version, surrogate_model="m", baseline_rps=4.0, candidate_rps=4.0 * emulated,
                     recorded_at=f"2026-01-01T00:00:0{i}")


def test_rows_carry_the_knob_families_and_the_log_error():
    r = _row(0, ["chunked_prefill_size", "speculative_algorithm"], 1.25, 1.0)
    assert families(["kv_cache_dtype", "quantization"]) == ["kernels_quant"]
    assert r["families"] == ["scheduling_cache", "speculative"] and r["family"] == "scheduling_cache+speculative"
    assert r["log_error"] == pytest.approx(math.log(1.0 / 1.25)) and r["abs_log_error"] == pytest.approx(-r["log_error"])


def test_the_report_groups_by_family_and_follows_the_error_over_time():
    rows = [_row(0, ["chunked_prefill_size"], 1.10, 1.00), _row(1, ["speculative_algorithm"], 1.50, 1.20),
            _row(2, ["chunked_prefill_size", "speculative_algorithm"], 1.30, 1.30)]
    rep = error_report(rows, window=2, threshold=0.5)
    fam = {f["family"]: f for f in rep["families"]}
    assert fam["scheduling_cache"]["n"] == 2 and fam["speculative"]["n"] == 2  # the mixed change counts in both
    assert fam["speculative"]["bias"] < 0  # the emulator over-predicted speculative decoding
    assert [t["experiment_id"] for t in rep["timeline"]] == ["e0", "e1", "e2"]
    assert rep["timeline"][-1]["rolling_median_abs_error"] == pytest.approx(abs(math.log(1.2 / 1.5)) / 2)
    md = to_markdown(rep)
    assert "| speculative | 2 |" in md and "drift: no" in md


def test_drift_needs_a_full_window_of_the_current_calibration_above_the_threshold():
    off = [_row(i, ["chunked_prefill_size"], 1.3, 1.0) for i in range(3)]  # ~26% off each
    assert drift(off[:2], window=3, threshold=0.1).drifting is False  # too few to judge
    d = drift(off, window=3, threshold=0.1)
    assert d.drifting and d.experiments == ["e0", "e1", "e2"] and d.median_abs_log_error == pytest.approx(math.log(1.3))
    assert not drift(off, window=3, threshold=0.3).drifting
    # a new calibration version starts a new window
    assert not drift(off + [_row(5, ["page_size"], 1.0, 1.0, version=2)], window=3, threshold=0.1).drifting
