"""Owns the statistics of experiments: the noise floor of repeated runs, the A/B verdict rules and the run schedule.

Pure functions over run-level numbers (one capacity per independent run); no I/O.

Statistic (``VERDICT_STATISTIC``): the Hodges-Lehmann shift of log capacities, exp(median over all
baseline x candidate pairs of log c_j - log b_i), with Lehmann's distribution-free interval (order
statistics of the pairwise differences at the Mann-Whitney statistic's normal quantile). Robust like
the median and about 0.8x its standard error on normal-like run noise: on the bench_verdicts banks at
exactly +-5% (the same scaled banks for both) the shared procedure's power went from 74.0% / 86.5% to
91.5% / 87.0% (reporting banks, run CV 3.6%) and from 93.0% / 93.0% to 99.0% / 94.5% (tuning banks),
A/A still 0.0%, at fewer runs. ``"median"`` keeps methods.md §1's median ratio with a
``scipy.stats.bootstrap`` BCa interval (10,000 resamples, whole runs resampled within each arm,
seeded). The A/A noise floor is computed for the statistic in use.

Rule (``VERDICT_RULE``, "reference" by default): methods.md §1's. better: the ratio at least 1+margin and a
significance bound above 1; worse: the ratio at most 1-margin and a significance bound below 1; same: the
verdict interval inside [1-margin, 1+margin]; anything else undecided. The significance bounds are the
verdict interval's, their two-sided alpha times ``SIGNIFICANCE_SCALE`` (0.1: each claim at 0.5% one-sided
per look, Pinpoint's p <= 0.01 for "different"), since a comparison looks at its runs up to seven times
(5, 10, 20 runs per arm and the extension's steps). "strict" (the rule before) needs the whole verdict
interval beyond 1±margin: with the margin already at the A/A noise floor, that counted the noise twice, and
at the demo's run CV of 4.8% a true +5% change was called "better" 40.5% of the time (shared control,
``bench_verdicts.py --exact 0.05`` on a reporting bank); the reference rule gives 72.5% there at the same
cost, with A/A still at 2.0% (tuning bank, CV 3.6%: 92.0% -> 97.5%, A/A 0.0%).

Confidence of the verdict interval: 90% two-sided (``DECISION_CONFIDENCE``), not the 95% of
methods.md §1. Each claim is one-sided, checked against one end of an interval (under "strict": better
the lower bound above 1+margin, worse the upper bound below 1-margin; same under either rule: both bounds
inside the margin, which is the two one-sided tests of an equivalence claim). A 90% two-sided interval gives
each of those one-sided claims a 5% error rate, the textbook level for TOST; a 95% interval tests
every claim at 2.5% and, on top of the practical margin, cost power without buying any false
positives the A/A benchmark could see (0.0% A/A "better"/"worse" at 95%; the 90% rate is
measured by ``benchmarks/bench_verdicts.py`` and must stay <= 2%). Reported spreads (the noise
floor's CI of the median) stay at 95%.

Capacities are quantised by the capacity search, so BCa can be undefined (all resampled statistics
equal, or a jackknife with no spread); then the percentile interval is used, and when the runs
within every arm are identical the interval collapses to the point estimate. The method actually
used is recorded in the result.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Literal, Sequence

import numpy as np
from scipy import stats as sps

from autoresearch_dagster.spec import Budget

VerdictName = Literal["better", "same", "worse", "undecided"]

CONFIDENCE = 0.95  # reported intervals (the noise floor's CI of the median)
DECISION_CONFIDENCE = 0.90  # the verdict interval: one-sided 95% bounds (see the module docstring)
N_RESAMPLES = 10_000
VERDICT_STATISTIC = "hl"  # "hl": Hodges-Lehmann shift, rank interval; "median": median ratio, bootstrap CI (methods.md)
MIN_MARGIN = 0.02
VERDICT_RULE = "reference"  # "strict": the CI beyond 1±margin; "reference": methods.md §1 (CI beyond 1, ratio beyond 1±margin)
SIGNIFICANCE_SCALE = 0.1  # "reference": the significance bounds' alpha = the verdict interval's alpha x this
# "reference": the "worse" significance bound also takes a shared control's multiplicity correction. A false "worse"
# is a false claim of a difference, which memory keeps as a finding ("it hurt here") and the A/A rate counts. Measured
# with bench_verdicts.py (shared control of 3, --exact 0.05, 200 comparisons per scenario) on the banks of stops 27-29:
# A/A 1.0/1.5/4.5/1.5% -> 0.5/0.5/2.5/1.0% (banks d/e/f/g; 3.1% -> 1.4% over 800 A/A draws on g), -5% power
# 94.5/91.0/95.0/94.5% -> 94.0/91.0/94.5/94.5%, +5% unchanged.
CORRECT_WORSE = True
AA_DRAWS = 20_000


@dataclass
class NoiseFloor:
    n: int
    median: float
    mean: float
    std: float
    cv: float  # sample std / mean (ddof=1)
    ci_low: float  # bootstrap CI of the median
    ci_high: float
    confidence: float
    ci_method: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Verdict:
    verdict: VerdictName
    ratio_median: float  # the statistic's candidate/baseline ratio (Hodges-Lehmann, or the median ratio); > 1: better
    ci_low: float
    ci_high: float
    margin: float  # max(min_margin, noise_floor)
    noise_cv: float  # run-level CV of capacity (from the noise baseline or this experiment's baseline runs)
    noise_floor: float  # 95th percentile of |A/A effect| at these run counts, given noise_cv
    n_baseline: int
    n_candidate: int
    p_value: float | None  # min(Mann-Whitney U, Kolmogorov-Smirnov) two-sided, as Pinpoint does
    equivalence_shown: bool  # True only when the CI lies inside [1-margin, 1+margin]
    underpowered: bool  # stopped without a decision while |ratio-1| >= margin
    reason: str
    ci_method: str
    confidence: float = DECISION_CONFIDENCE  # two-sided level of the lower bound (the "better" claim)
    baseline: list[float] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    upper_confidence: float | None = None  # two-sided level of the upper bound when it differs (``verdict``)

    @property
    def upper_level(self) -> float:
        return self.confidence if self.upper_confidence is None else self.upper_confidence

    def to_dict(self) -> dict:
        return asdict(self)


def _clean(values: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray([float(v) for v in values], dtype=float)
    if arr.ndim != 1 or len(arr) == 0:
        raise ValueError(f"{what}: need at least one run-level value")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: values must be finite, got {list(values)}")
    return arr


def _bootstrap_ci(samples: tuple[np.ndarray, ...], statistic, *, seed: int,
                  confidence: float, n_resamples: int) -> tuple[float, float, str]:
    point = float(statistic(*samples))
    if all(np.ptp(s) == 0 for s in samples):
        return point, point, "degenerate"
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = sps.bootstrap(samples, statistic, method=method, n_resamples=n_resamples,
                                confidence_level=confidence, vectorized=True,
                                random_state=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi, method
    return point, point, "degenerate"


def _median(x, axis=-1):
    return np.median(x, axis=axis)


def _median_ratio(baseline, candidate, axis=-1):
    return np.median(candidate, axis=axis) / np.median(baseline, axis=axis)


def median_ratio_interval(baseline: Sequence[float], candidate: Sequence[float], *, seed: int = 0,
                          confidence: float = DECISION_CONFIDENCE,
                          n_resamples: int = N_RESAMPLES) -> tuple[float, float, float, str]:
    """median(candidate) / median(baseline) with the verdicts' bootstrap interval: (ratio, low, high, method)."""
    a = _clean(baseline, "ratio baseline")
    b = _clean(candidate, "ratio candidate")
    if np.median(a) <= 0:
        raise ValueError(f"ratio: baseline median must be > 0, got {float(np.median(a))}")
    lo, hi, method = _bootstrap_ci((a, b), _median_ratio, seed=seed, confidence=confidence, n_resamples=n_resamples)
    return float(np.median(b) / np.median(a)), lo, hi, method


def noise_floor(capacities: Sequence[float], *, seed: int = 0, confidence: float = CONFIDENCE,
                n_resamples: int = N_RESAMPLES) -> NoiseFloor:
    """Spread of repeated baseline runs: CV and a bootstrap CI of the median."""
    arr = _clean(capacities, "noise_floor")
    if len(arr) < 2:
        raise ValueError("noise_floor: need at least 2 runs to estimate a spread")
    mean = float(arr.mean())
    std = float(arr.std(ddof=1))
    lo, hi, method = _bootstrap_ci((arr,), _median, seed=seed, confidence=confidence, n_resamples=n_resamples)
    return NoiseFloor(n=len(arr), median=float(np.median(arr)), mean=mean, std=std,
                      cv=std / mean if mean > 0 else float("inf"), ci_low=lo, ci_high=hi,
                      confidence=confidence, ci_method=method)


@lru_cache(maxsize=256)
def _aa_floor(cv: float, n_baseline: int, n_candidate: int, quantile: float) -> float:
    rng = np.random.default_rng(12345)
    sigma = math.sqrt(math.log1p(cv * cv))
    a = np.median(rng.lognormal(0.0, sigma, (AA_DRAWS, n_baseline)), axis=1)
    b = np.median(rng.lognormal(0.0, sigma, (AA_DRAWS, n_candidate)), axis=1)
    return float(np.quantile(np.abs(b / a - 1.0), quantile))


@lru_cache(maxsize=256)
def _aa_floor_hl(cv: float, n_baseline: int, n_candidate: int, quantile: float) -> float:
    rng = np.random.default_rng(12345)
    sigma = math.sqrt(math.log1p(cv * cv))
    draws = AA_DRAWS // 5  # n x m pairs per draw: 4,000 draws keep the 95th percentile within ~1% of itself
    a = rng.normal(0.0, sigma, (draws, n_baseline))
    b = rng.normal(0.0, sigma, (draws, n_candidate))
    pairs = n_baseline * n_candidate
    chunk = max(1, 2_000_000 // max(1, pairs))  # draws per slice: bounded memory for large arms
    shifts = np.concatenate([np.median((b[i:i + chunk, :, None] - a[i:i + chunk, None, :]).reshape(-1, pairs), axis=1)
                             for i in range(0, draws, chunk)])
    return float(np.quantile(np.abs(np.expm1(shifts)), quantile))


def hl_ratio_interval(baseline: np.ndarray, candidate: np.ndarray, *, confidence: float) -> tuple[float, float, float]:
    """The Hodges-Lehmann shift of log capacities as a ratio, exp(median over pairs of log c_j - log b_i), with
    its distribution-free interval (Lehmann: the k-th smallest and largest pairwise differences, k from the
    Mann-Whitney statistic's normal approximation). About 0.8x the standard error of the median ratio on
    normal-like run noise, and no bootstrap."""
    d = np.sort(np.subtract.outer(np.log(candidate), np.log(baseline)).ravel())
    n, m = len(baseline), len(candidate)
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    k = int(math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12.0)))
    k = min(max(k, 0), len(d) - 1)
    return float(math.exp(np.median(d))), float(math.exp(d[k])), float(math.exp(d[len(d) - 1 - k]))


def aa_noise_floor(cv: float, n_baseline: int, n_candidate: int, *, quantile: float = 0.95) -> float:
    """The noise floor of a comparison (methods.md §1): the ``quantile`` of |median ratio - 1| between two
    arms of identical configs with these run counts, when single runs vary with coefficient ``cv``.

    Computed by a seeded Monte Carlo over lognormal run-level noise (20,000 A/A draws), so it is exact
    for small run counts where the normal approximation of the median is poor.
    """
    if not (cv >= 0 and math.isfinite(cv)):
        raise ValueError(f"aa_noise_floor: cv must be a finite number >= 0, got {cv}")
    if cv == 0:
        return 0.0
    floor = _aa_floor_hl if VERDICT_STATISTIC == "hl" else _aa_floor
    return floor(round(float(cv), 6), int(n_baseline), int(n_candidate), float(quantile))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, CV and relative range of one quantity across runs (latency quantiles at a reference rate)."""
    arr = _clean(values, "spread")
    med = float(np.median(arr))
    mean = float(arr.mean())
    cv = float(arr.std(ddof=1) / mean) if len(arr) > 1 and mean > 0 else 0.0
    rel_range = float(np.ptp(arr) / med) if med > 0 else 0.0
    return {"n": len(arr), "median": med, "mean": mean, "cv": cv, "rel_range": rel_range,
            "min": float(arr.min()), "max": float(arr.max())}


def verdict_margin(noise_cv: float, n_baseline: int, n_candidate: int, *, min_margin: float = MIN_MARGIN) -> float:
    """The practical margin of a verdict: max(min_margin, the A/A noise floor at these run counts)."""
    return max(float(min_margin), aa_noise_floor(noise_cv, n_baseline, n_candidate))


def _p_value(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0 and a[0] == b[0]):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mwu = sps.mannwhitneyu(a, b, alternative="two-sided").pvalue
        ks = sps.ks_2samp(a, b).pvalue
    return float(min(mwu, ks))


def verdict(baseline: Sequence[float], candidate: Sequence[float], *, noise_cv: float,
            min_margin: float = MIN_MARGIN, seed: int = 0, confidence: float = DECISION_CONFIDENCE,
            upper_confidence: float | None = None, n_resamples: int = N_RESAMPLES) -> Verdict:
    """better | same | worse | undecided from run-level capacities (higher is better).

    Statistic: the Hodges-Lehmann ratio with its rank interval (``VERDICT_STATISTIC`` "median":
    median(candidate)/median(baseline) with a bootstrap CI), 90% two-sided by default: each verdict is a
    one-sided claim at 5%. ``ratio_median`` holds the statistic's ratio. Margin = max(min_margin, noise floor), the noise floor
    being the 95th percentile of |A/A effect| at these run counts given the run-level ``noise_cv``
    (``aa_noise_floor``, methods.md §1). ``VERDICT_RULE`` "reference": better when the ratio is >= 1+margin and
    the significance bound (``_significance_bounds``) above 1, worse symmetrically; "strict": better when the
    CI is entirely above 1+margin, worse entirely below 1-margin. same: CI inside [1-margin, 1+margin];
    anything else is undecided (the harness adds runs).

    ``upper_confidence`` (when set and below ``confidence``) takes the upper bound from a narrower interval
    of the same bootstrap seed: the multiplicity correction of a shared control (``confidence`` widened
    for the candidates sharing it) then guards what each candidate would be promoted on, the lower
    bound, while the interval's upper bound (the gain side of "same") keeps the per-comparison level: a wrong
    "same" costs a missed gain, never a false promotion. The "worse" claim's significance bound takes the
    corrected level too while ``CORRECT_WORSE`` is set (the default): a false "worse" claims a difference, which
    memory keeps as a finding, and uncorrected it made most of the A/A errors.
    """
    a = _clean(baseline, "verdict baseline")
    b = _clean(candidate, "verdict candidate")
    if np.median(a) <= 0:
        raise ValueError(f"verdict: baseline median must be > 0, got {float(np.median(a))}")
    if not (noise_cv >= 0 and math.isfinite(noise_cv)):
        raise ValueError(f"verdict: noise_cv must be a finite number >= 0, got {noise_cv}")
    floor = aa_noise_floor(float(noise_cv), len(a), len(b))
    margin = verdict_margin(float(noise_cv), len(a), len(b), min_margin=min_margin)
    ratio = float(np.median(b) / np.median(a))
    split = upper_confidence is not None and upper_confidence < confidence
    if VERDICT_STATISTIC == "hl" and np.all(a > 0) and np.all(b > 0):
        ratio, lo, hi = hl_ratio_interval(a, b, confidence=confidence)
        method = "degenerate" if np.ptp(a) == 0 and np.ptp(b) == 0 else "hodges-lehmann"
        if split:
            hi = max(min(hi, hl_ratio_interval(a, b, confidence=upper_confidence)[2]), lo)
    else:
        lo, hi, method = _bootstrap_ci((a, b), _median_ratio, seed=seed, confidence=confidence,
                                       n_resamples=n_resamples)
        if split:
            _, hi_u, method_u = _bootstrap_ci((a, b), _median_ratio, seed=seed, confidence=upper_confidence,
                                              n_resamples=n_resamples)
            hi = max(min(hi, hi_u), lo)
            method = method if method_u == method else f"{method}/{method_u}"
    if not split:
        upper_confidence = None
    lo_s, hi_s = lo, hi
    if VERDICT_RULE == "reference":  # the significance bounds: each interval's two-sided alpha times SIGNIFICANCE_SCALE
        lo_s, hi_s = _significance_bounds(a, b, confidence, upper_confidence, seed=seed, n_resamples=n_resamples)
    if VERDICT_RULE == "reference" and lo_s > 1 and ratio >= 1 + margin:
        name, reason = "better", (f"significance bound {lo_s:.4f} above 1 and ratio {ratio:.4f} >= 1+margin="
                                  f"{1 + margin:.4f} (CI [{lo:.4f}, {hi:.4f}])")
    elif VERDICT_RULE == "reference" and hi_s < 1 and ratio <= 1 - margin:
        name, reason = "worse", (f"significance bound {hi_s:.4f} below 1 and ratio {ratio:.4f} <= 1-margin="
                                 f"{1 - margin:.4f} (CI [{lo:.4f}, {hi:.4f}])")
    elif VERDICT_RULE == "strict" and lo > 1 + margin:
        name, reason = "better", f"CI [{lo:.4f}, {hi:.4f}] above 1+margin={1 + margin:.4f}"
    elif VERDICT_RULE == "strict" and hi < 1 - margin:
        name, reason = "worse", f"CI [{lo:.4f}, {hi:.4f}] below 1-margin={1 - margin:.4f}"
    elif lo >= 1 - margin and hi <= 1 + margin:
        name, reason = "same", f"CI [{lo:.4f}, {hi:.4f}] inside 1±{margin:.4f}"
    else:
        name, reason = "undecided", f"CI [{lo:.4f}, {hi:.4f}] straddles a margin boundary (1±{margin:.4f})"
    return Verdict(verdict=name, ratio_median=ratio, ci_low=lo, ci_high=hi, margin=margin,
                   noise_cv=float(noise_cv), noise_floor=floor, n_baseline=len(a), n_candidate=len(b),
                   p_value=_p_value(a, b), equivalence_shown=name == "same", underpowered=False,
                   reason=reason, ci_method=method, confidence=confidence,
                   baseline=a.tolist(), candidate=b.tolist(), upper_confidence=upper_confidence)


def _significance_bounds(a: np.ndarray, b: np.ndarray, confidence: float, upper_confidence: float | None, *,
                         seed: int, n_resamples: int) -> tuple[float, float]:
    """The lower and upper bounds "better" and "worse" test against 1 under ``VERDICT_RULE == "reference"``: the
    verdict interval's levels with their two-sided alpha scaled by ``SIGNIFICANCE_SCALE`` (each claim at 0.5%
    one-sided per look by default, divided by the comparisons sharing a control: on the "better" side always, on
    the "worse" side while ``CORRECT_WORSE`` is set)."""
    lo_conf = 1.0 - (1.0 - confidence) * SIGNIFICANCE_SCALE
    upper = confidence if CORRECT_WORSE or upper_confidence is None else upper_confidence
    hi_conf = 1.0 - (1.0 - upper) * SIGNIFICANCE_SCALE
    if VERDICT_STATISTIC == "hl" and np.all(a > 0) and np.all(b > 0):
        return hl_ratio_interval(a, b, confidence=lo_conf)[1], hl_ratio_interval(a, b, confidence=hi_conf)[2]
    lo = _bootstrap_ci((a, b), _median_ratio, seed=seed, confidence=lo_conf, n_resamples=n_resamples)[0]
    hi = _bootstrap_ci((a, b), _median_ratio, seed=seed, confidence=hi_conf, n_resamples=n_resamples)[1]
    return lo, hi


def run_cv(values: Sequence[float]) -> float:
    """Sample CV (ddof=1) of run-level values: the noise floor's spread without its bootstrap."""
    arr = _clean(values, "run_cv")
    mean = float(arr.mean())
    return float(arr.std(ddof=1) / mean) if len(arr) > 1 and mean > 0 else 0.0


def run_schedule(budget: Budget | None = None) -> tuple[int, ...]:
    """Runs per arm at each stage: initial, doubling, capped (5 -> 10 -> 20 by default); an undecided
    verdict at one stage moves to the next."""
    b = budget or Budget()
    if b.initial_runs_per_arm < 2 or b.max_runs_per_arm < b.initial_runs_per_arm:
        raise ValueError(f"budget: need 2 <= initial_runs_per_arm <= max_runs_per_arm, got "
                         f"{b.initial_runs_per_arm}, {b.max_runs_per_arm}")
    out = [b.initial_runs_per_arm]
    while out[-1] < b.max_runs_per_arm:
        out.append(min(out[-1] * 2, b.max_runs_per_arm))
    return tuple(out)


EXTENSION_MULTIPLE = 2  # a promising comparison's runs per arm may reach this many times the cap


def extension_schedule(schedule: Sequence[int], multiple: int | None = None) -> tuple[int, ...]:
    """Runs per arm past the cap for a comparison still promising there (|ratio - 1| >= margin, undecided) when
    no confirmation stage follows: steps of the first stage's size up to twice the cap (20 -> 25, 30, 35, 40).
    Measured on ``benchmarks/bench_verdicts.py --exact 0.05``: a true +-5% change at the demo's 3.1% run CV
    reaches "better"/"worse" about 9 times in 10 this way, against under 8 in 10 stopping at the cap."""
    first, cap = schedule[0], schedule[-1]
    return tuple(range(cap + first, (multiple or EXTENSION_MULTIPLE) * cap + 1, first))


# Which undecided comparisons at the run cap get the extension (``worth_extending``). Chosen on a tuning bank
# (bench_verdicts.py on out/bv/banks-d.pkl, run CV 4.99%, shared procedure at exactly +-5%): "promising" gave +5% 77.5%,
# -5% 87.0%; "reachable" 84.5% / 94.0%, A/A 0.0% with either and the same median GPU-hours per decided verdict.
# Reported on a fresh bank (banks-e, CV 4.67%): +5% 84.0 -> 85.0%, -5% 93.0 -> 95.5%, A/A 1.0 -> 1.5% (docs/campaign.md).
EXTENSION_RULE = "reachable"


def worth_extending(v: Verdict, final_n: int, *, rule: str | None = None, min_margin: float = MIN_MARGIN) -> bool:
    """Whether an undecided comparison at the run cap (or inside the extension) gets more runs, up to ``final_n`` per
    arm. "promising": its estimate lies beyond the margin. "reachable": that, or the estimate is inside the margin but
    its one-sided futility bound (90%) on the estimate's side reaches the margin those runs would have, so a
    decision is still within reach."""
    if abs(v.ratio_median - 1) >= v.margin:
        return True
    if (rule or EXTENSION_RULE) != "reachable":
        return False
    end_margin = verdict_margin(v.noise_cv, max(v.n_baseline, final_n), final_n, min_margin=min_margin)
    if v.ratio_median >= 1:
        return futility_bound(v) >= 1 + end_margin
    return loss_guard_bound(v, FUTILITY_CONFIDENCE) <= 1 - end_margin


def next_stage(runs_per_arm: int, schedule: Sequence[int] | None = None) -> int | None:
    """Runs per arm for the next stage after an undecided verdict at ``runs_per_arm``; None at the cap."""
    for n in schedule or run_schedule():
        if n > runs_per_arm:
            return n
    return None


def decision_margin(noise_cv: float, budget: Budget | None = None, *, min_margin: float = MIN_MARGIN) -> float:
    """The smallest ratio change an experiment under ``budget`` can call better or worse: the verdict
    margin at the run schedule's cap (earlier stages decide only beyond a wider margin)."""
    n = run_schedule(budget)[-1]
    return verdict_margin(noise_cv, n, n, min_margin=min_margin)


def stop_undecided(v: Verdict, why: str) -> Verdict:
    """Close an undecided comparison when the run cap or the budget says stop: "same", not shown."""
    if v.verdict != "undecided":
        return v
    underpowered = abs(v.ratio_median - 1) >= v.margin
    reason = (f"same (not distinguishable at margin {v.margin:.4f}): {why}; {v.reason}"
              + ("; underpowered: the point estimate is outside the margin" if underpowered else ""))
    return Verdict(**{**asdict(v), "verdict": "same", "equivalence_shown": False,
                      "underpowered": underpowered, "reason": reason})


# one-sided: stopping a candidate that cannot win risks only a missed gain. 0.95 since runs are warm-started (half
# the cost): on the tuning bank (bench_verdicts.py, out/bv/banks-d.pkl; its warm banks then scaled by the cold
# banks' --exact factors) 0.90 -> 0.95 took +5% from 87.5% to 89.5% and -5% from 92.5% to 94.5%, A/A 1.0% either
# way, shared/classic cost 0.27 -> 0.28; 0.975 gave 94.0% / 95.5% but the A/A comparisons lost their early stop
# (3.40 -> 10.14 GPU-h each: no cheaper than the classic procedure's)
FUTILITY_CONFIDENCE = 0.95


def futility_bound(v: Verdict, confidence: float | None = None) -> float:
    """The one-sided upper bound of the ratio at ``confidence``, scaled from the verdict's interval (its upper
    half-width times z(confidence) / z(verdict level)): cheaper than a second bootstrap, and a stop for
    futility needs less certainty than a claim of "better" (a wrong stop costs a missed gain, never a
    false promotion)."""
    z_v = float(sps.norm.ppf(0.5 + v.upper_level / 2))
    z_f = float(sps.norm.ppf(FUTILITY_CONFIDENCE if confidence is None else confidence))
    return v.ratio_median + max(0.0, v.ci_high - v.ratio_median) * z_f / z_v


# one-sided: a futility stop also needs the ratio's lower bound at this level above 1 - the practical margin. Chosen on
# the tuning banks (bench_verdicts.py on out/bv/banks-b.pkl): 0.70 took the -5% power from 87.0% to 95.0% but the A/A
# comparisons' extra runs put the shared/classic cost at 0.50; 0.60 gave 93.0% at 0.49, A/A 0.0% with either.
LOSS_GUARD_CONFIDENCE = 0.60


def loss_guard_bound(v: Verdict, confidence: float = LOSS_GUARD_CONFIDENCE) -> float:
    """The one-sided lower bound of the ratio at ``confidence``, scaled from the verdict's lower half-width (as
    ``futility_bound`` scales the upper one)."""
    z_v = float(sps.norm.ppf(0.5 + v.confidence / 2))
    z = float(sps.norm.ppf(confidence))
    return v.ratio_median - max(0.0, v.ratio_median - v.ci_low) * z / z_v


def not_better(v: Verdict, *, min_margin: float = MIN_MARGIN) -> bool:
    """Further runs are unlikely to make this comparison "better": its one-sided futility bound lies below
    1 + margin, and a loss of the practical size (``min_margin``) is unlikely: the one-sided 60% lower bound
    (``loss_guard_bound``) lies above 1 - min_margin, so a "worse" still gets the runs that show it. (Against the
    stage's own margin, which the noise floor of an early stage inflates to about 5%, a true -5% candidate stopped
    as "same" half the time; against the point estimate alone, one early stage in ten of a true -5% candidate read
    above 0.98 and stopped, which held the -5% power near 87%.)"""
    return (v.verdict in ("undecided", "same") and futility_bound(v) < 1 + v.margin
            and loss_guard_bound(v) >= 1 - min_margin)


def stop_not_better(v: Verdict) -> Verdict:
    """Close a comparison that cannot become "better" (``not_better``) as "same", saying so."""
    reason = (f"same (futility: the one-sided {FUTILITY_CONFIDENCE:.0%} upper bound {futility_bound(v):.4f} is below "
              f"1+margin={1 + v.margin:.4f}, so more runs would not show a gain); {v.reason}")
    return Verdict(**{**asdict(v), "verdict": "same", "equivalence_shown": v.verdict == "same", "reason": reason})
