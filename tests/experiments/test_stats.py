"""Verdict rules and bootstrap sanity on synthetic run-level capacities."""
from __future__ import annotations

import math

import numpy as np
import pytest

from autoresearch_dagster.experiments import stats
from autoresearch_dagster.spec import Budget


def _sample(rng, mean, cv, n):
    return (mean * rng.lognormal(0, cv, n)).tolist()


def test_clear_better_worse_same():
    rng = np.random.default_rng(1)
    base = _sample(rng, 10.0, 0.01, 10)
    assert stats.verdict(base, _sample(rng, 11.5, 0.01, 10), noise_cv=0.01).verdict == "better"
    assert stats.verdict(base, _sample(rng, 8.5, 0.01, 10), noise_cv=0.01).verdict == "worse"
    same = stats.verdict(base, _sample(rng, 10.0, 0.003, 10), noise_cv=0.005)
    assert same.verdict == "same" and same.equivalence_shown
    assert same.margin == pytest.approx(0.02)  # max(2%, noise)


def test_margin_follows_noise_floor_and_evidence_is_kept():
    rng = np.random.default_rng(2)
    base, cand = _sample(rng, 10, 0.01, 10), _sample(rng, 10.5, 0.01, 10)
    v = stats.verdict(base, cand, noise_cv=0.08)
    assert v.margin == pytest.approx(stats.aa_noise_floor(0.08, 10, 10)) and v.margin > 0.06
    assert v.verdict != "better"  # +5% is inside the A/A noise floor of 8%-CV runs
    assert v.baseline == base and v.candidate == cand and v.n_baseline == 10
    assert v.ci_low <= v.ratio_median <= v.ci_high
    assert stats.verdict(base, cand, noise_cv=0.0).verdict == "better"


def test_undecided_then_more_runs_then_budget_stop():
    rng = np.random.default_rng(3)
    base, cand = _sample(rng, 10, 0.04, 5), _sample(rng, 10.4, 0.04, 5)
    v = stats.verdict(base, cand, noise_cv=0.02)
    assert v.verdict == "undecided"
    assert stats.next_stage(5) == 10 and stats.next_stage(10) == 20 and stats.next_stage(20) is None
    stopped = stats.stop_undecided(v, "run cap of 20 per arm reached")
    assert stopped.verdict == "same" and not stopped.equivalence_shown
    assert "run cap" in stopped.reason and "not distinguishable" in stopped.reason


def test_identical_runs_are_degenerate_but_decided():
    v = stats.verdict([10.0] * 5, [10.0] * 5, noise_cv=0.0)
    assert v.verdict == "same" and v.ci_method == "degenerate"
    assert stats.verdict([10.0] * 5, [11.0] * 5, noise_cv=0.0).verdict == "better"


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="finite"):
        stats.verdict([1.0, float("nan")], [1.0, 1.0], noise_cv=0.0)
    with pytest.raises(ValueError, match="noise_cv"):
        stats.verdict([1.0, 1.1], [1.0, 1.0], noise_cv=-1)
    with pytest.raises(ValueError, match="at least 2"):
        stats.noise_floor([1.0])


def test_noise_floor_cv_and_ci():
    rng = np.random.default_rng(4)
    caps = _sample(rng, 20.0, 0.03, 40)
    nf = stats.noise_floor(caps)
    assert 0.02 < nf.cv < 0.045
    assert nf.ci_low < nf.median < nf.ci_high
    assert 19.0 < nf.median < 21.0


def test_bootstrap_ci_coverage_of_the_median_ratio():
    """95% CIs of the median ratio should cover the true ratio most of the time (n=10 per arm)."""
    rng = np.random.default_rng(5)
    covered = 0
    trials = 120
    for i in range(trials):
        base, cand = _sample(rng, 10, 0.03, 10), _sample(rng, 10.3, 0.03, 10)
        v = stats.verdict(base, cand, noise_cv=0.03, seed=i, n_resamples=2000, confidence=0.95)
        covered += v.ci_low <= 1.03 <= v.ci_high
    assert covered / trials >= 0.85  # small-sample median bootstrap under-covers a little, never badly


def test_aa_false_positive_rate_is_low():
    rng = np.random.default_rng(6)
    wrong = 0
    for i in range(150):
        v = stats.verdict(_sample(rng, 10, 0.025, 5), _sample(rng, 10, 0.025, 5), noise_cv=0.025, seed=i,
                          n_resamples=2000)
        wrong += v.verdict in ("better", "worse")
    assert wrong / 150 <= 0.02


def test_aa_noise_floor_shrinks_with_runs_and_grows_with_cv():
    f = stats.aa_noise_floor
    assert f(0.0, 5, 5) == 0.0
    assert f(0.02, 5, 5) > f(0.02, 10, 10) > f(0.02, 20, 20)
    assert f(0.03, 10, 10) > f(0.02, 10, 10)
    # normal approximations at large n: the Hodges-Lehmann shift 1.96 * sqrt(pi/3) * cv * sqrt(2/n), the
    # median ratio 1.96 * 1.2533 * cv * sqrt(2/n)
    assert f(0.02, 20, 20) == pytest.approx(1.96 * (math.pi / 3) ** 0.5 * 0.02 * (2 / 20) ** 0.5, rel=0.15)


def test_the_median_statistic_is_still_there(monkeypatch):
    monkeypatch.setattr(stats, "VERDICT_STATISTIC", "median")
    assert stats.aa_noise_floor(0.02, 20, 20) == pytest.approx(1.96 * 1.2533 * 0.02 * (2 / 20) ** 0.5, rel=0.15)
    rng = np.random.default_rng(3)
    v = stats.verdict(_sample(rng, 10.0, 0.02, 12), _sample(rng, 11.0, 0.02, 12), noise_cv=0.02)
    assert v.verdict == "better" and v.ci_method in ("BCa", "percentile")


def test_the_hodges_lehmann_ratio_is_tighter_than_the_median_ratio_on_normal_noise():
    rng = np.random.default_rng(11)
    widths = {"hl": [], "median": []}
    for _ in range(30):
        a, b = _sample(rng, 10.0, 0.04, 20), _sample(rng, 10.5, 0.04, 20)
        r, lo, hi = stats.hl_ratio_interval(np.asarray(a), np.asarray(b), confidence=0.90)
        assert lo <= r <= hi
        widths["hl"].append(hi - lo)
        _, mlo, mhi, _ = stats.median_ratio_interval(a, b, confidence=0.90, n_resamples=2000)
        widths["median"].append(mhi - mlo)
    assert np.median(widths["hl"]) < 0.9 * np.median(widths["median"])


def test_spread_of_latency_quantiles():
    s = stats.spread([100.0, 110.0, 90.0, 105.0, 95.0])
    assert s["median"] == 100.0 and 0.05 < s["cv"] < 0.1 and s["rel_range"] == pytest.approx(0.2)


def test_one_run_schedule_derived_from_the_budget():
    assert stats.run_schedule() == (5, 10, 20)  # the default Budget
    custom = stats.run_schedule(Budget(initial_runs_per_arm=3, max_runs_per_arm=10))
    assert custom == (3, 6, 10) and stats.next_stage(6, custom) == 10 and stats.next_stage(10, custom) is None
    with pytest.raises(ValueError, match="initial_runs_per_arm"):
        stats.run_schedule(Budget(initial_runs_per_arm=1))


def test_the_proposal_margin_is_the_verdict_margin_at_the_run_cap():
    # the rule in dispute: the loop derived max(2%, capacity CV) itself; a verdict at the cap uses
    # max(min_margin, A/A floor at the cap's run counts), which is what a proposal must beat
    rng = np.random.default_rng(5)
    base, cand = _sample(rng, 10, 0.05, 20), _sample(rng, 10.5, 0.05, 20)
    at_cap = stats.verdict(base, cand, noise_cv=0.05).margin
    assert stats.decision_margin(0.05) == pytest.approx(at_cap)
    assert stats.decision_margin(0.05) != pytest.approx(max(0.02, 0.05))
    small = Budget(initial_runs_per_arm=2, max_runs_per_arm=2)
    assert stats.decision_margin(0.05, small) > stats.decision_margin(0.05)  # fewer runs, wider margin
    assert stats.decision_margin(0.0, min_margin=0.03) == 0.03


def test_multiplicity_correction_guards_the_better_claim_only():
    """A shared control's Bonferroni widening moves the lower bound (what a promotion rests on); with
    ``upper_confidence`` the upper bound keeps the per-comparison level, so a loss stays visible."""
    rng = np.random.default_rng(7)
    base, cand = _sample(rng, 10.0, 0.03, 12), _sample(rng, 9.35, 0.03, 12)
    wide = stats.verdict(base, cand, noise_cv=0.03, confidence=1 - 0.10 / 3)
    split = stats.verdict(base, cand, noise_cv=0.03, confidence=1 - 0.10 / 3, upper_confidence=0.90)
    plain = stats.verdict(base, cand, noise_cv=0.03)
    assert split.ci_low == pytest.approx(wide.ci_low)  # the promotion side keeps the corrected level
    assert split.ci_high == pytest.approx(plain.ci_high) and split.ci_high < wide.ci_high
    assert split.upper_level == 0.90 and wide.upper_level == pytest.approx(1 - 0.10 / 3)
    # the one-sided futility bound scales from the level the upper bound was computed at: both intervals
    # give about the same 90% one-sided bound (scaling the narrower one by the wider level's z would not)
    assert stats.futility_bound(split) == pytest.approx(stats.futility_bound(wide), rel=0.0015)
    # a level above the lower bound's is ignored: the interval is never narrower on the promotion side
    same_level = stats.verdict(base, cand, noise_cv=0.03, confidence=0.90, upper_confidence=0.95)
    assert same_level.upper_confidence is None and same_level.ci_high == pytest.approx(plain.ci_high)


def test_the_reference_rule_needs_significance_and_magnitude_not_the_whole_interval_past_the_margin(monkeypatch):
    """methods.md §1: better = the ratio >= 1+margin and a significance bound above 1. The strict rule (the whole
    interval above 1+margin) counts the noise twice once the margin is the A/A noise floor."""
    rng = np.random.default_rng(1)
    base, cand = _sample(rng, 10.0, 0.03, 20), _sample(rng, 10.3, 0.03, 20)
    ref = stats.verdict(base, cand, noise_cv=0.03)
    assert ref.ratio_median >= 1 + ref.margin and ref.verdict == "better"
    lo_s, hi_s = stats._significance_bounds(np.asarray(base), np.asarray(cand), 0.90, None, seed=0,
                                            n_resamples=1000)
    assert 1 < lo_s < ref.ci_low  # the significance bound is the wider (99%) interval's
    monkeypatch.setattr(stats, "VERDICT_RULE", "strict")
    strict = stats.verdict(base, cand, noise_cv=0.03)
    assert strict.ci_low < 1 + strict.margin and strict.verdict == "undecided"


def test_the_reference_rule_refuses_an_estimate_past_the_margin_without_significance():
    """A ratio beyond the margin whose 99% significance bound still reaches 1 is not "better" (nor "worse")."""
    rng = np.random.default_rng(0)
    base, cand = _sample(rng, 10.0, 0.06, 5), _sample(rng, 10.7, 0.06, 5)
    v = stats.verdict(base, cand, noise_cv=0.06)
    lo_s, _ = stats._significance_bounds(np.asarray(base), np.asarray(cand), 0.90, None, seed=0, n_resamples=1000)
    assert v.ratio_median >= 1 + v.margin and lo_s <= 1 and v.verdict == "undecided"
    worse = stats.verdict(cand, base, noise_cv=0.06)
    assert worse.ratio_median <= 1 - worse.margin and worse.verdict == "undecided"


def test_run_cv_is_the_sample_cv():
    assert stats.run_cv([9.0, 10.0, 11.0]) == pytest.approx(1.0 / 10.0)
    assert stats.run_cv([5.0]) == 0.0


def test_a_shared_control_corrects_the_worse_claim_too_when_asked(monkeypatch):
    """With candidates sharing a control, "worse" is tested at the corrected level too (CORRECT_WORSE): its
    significance bound is the wider interval's, so a loss just significant per comparison is not "worse" across
    three, while the same comparison alone still is."""
    base = np.asarray([10.0, 10.4, 9.6, 10.2, 9.8, 10.1, 9.9, 10.3, 9.7, 10.0])
    hits = {}
    for shift in np.linspace(0.90, 0.99, 91):
        cand = base * shift + np.asarray([0.05, -0.05] * 5)
        lo_1, hi_1 = stats._significance_bounds(base, cand, 0.90, None, seed=0, n_resamples=1000)
        _, hi_3 = stats._significance_bounds(base, cand, 1 - 0.10 / 3, None, seed=0, n_resamples=1000)
        if hi_1 < 1 <= hi_3:  # significant at one comparison's level, not at three's
            hits[shift] = cand
    assert hits, "no shift lands between the two levels"
    shift, cand = max(hits.items())
    kw = dict(noise_cv=0.01, min_margin=0.01, confidence=1 - 0.10 / 3, upper_confidence=0.90)
    monkeypatch.setattr(stats, "CORRECT_WORSE", False)
    uncorrected = stats.verdict(base, cand, **kw)
    assert uncorrected.verdict == "worse"
    monkeypatch.setattr(stats, "CORRECT_WORSE", True)
    corrected = stats.verdict(base, cand, **kw)
    assert corrected.verdict != "worse"
    assert corrected.ci_high == pytest.approx(uncorrected.ci_high)  # the interval ("same") keeps its level
    assert stats.verdict(base, cand, noise_cv=0.01, min_margin=0.01).verdict == "worse"  # one comparison alone
