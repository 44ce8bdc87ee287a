"""Owns load-step statistics, the capacity search and the production-shape replay.

Everything here works on ``StepOutcome`` records through the ``Deployment`` protocol only
(``run_step`` and the admin methods), so the same code measures the emulator's virtual-time engine,
its HTTP server, a local SGLang or any OpenAI-compatible URL.

- ``summarize_step``: one load step → offered/achieved rate, p50/p95/p99 TTFT/ITL/TPOT/E2E, error
  rate, goodput (req/s meeting every SLA term), queue growth, validity.
- ``find_capacity``: warm-up, then load steps whose rate grows geometrically until the SLA breaks,
  bisection to a relative resolution, and a re-confirmation of the final point on a fresh schedule.
  Capacity = the highest confirmed rate meeting the SLA. Invalid steps never count as passing.
- ``run_shape``: the pool's production shape at a speed-up; per-interval SLA attainment; replay
  capacity = the largest speed-up meeting the SLA (same grow + bisect search); autoscaling report
  from the engine's ``replicas`` timeseries when it has one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
from scipy import stats as sstats

from autoresearch_dagster.engines.base import Deployment
from autoresearch_dagster.loadgen.records import RequestRecord, StepOutcome
from autoresearch_dagster.loadgen.schedule import build_schedule, interval_counts, poisson_offsets, shape_offsets
from autoresearch_dagster.spec import SLA, SLATerm

_QUANTILES = {"p50": 50, "p95": 95, "p99": 99}


@dataclass
class LoadStep:
    step_id: str
    rate_rps: float  # the rate (or speed-up, for shape replays) this step was asked to offer
    offered_rps: float  # what the schedule actually offered over its window
    achieved_rps: float  # ok completions/s inside the arrival window after it filled (see _steady_throughput)
    n_sent: int
    n_ok: int
    n_failed: int
    n_timeout: int
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    error_rate: float
    goodput_rps: float  # the part of achieved_rps made of requests meeting every SLA term
    meets_sla: bool
    failed_terms: list[str]
    queue_growth: bool
    valid: bool
    invalid_reasons: list[str]
    duration_s: float = 0.0
    send_lag_p99_ms: float | None = None
    sla_attainment: float = 0.0  # fraction of sent requests that met every SLA term
    # max over the SLA's quantile terms (and the error limit) of measured / bound: > 1 breaks the SLA
    sla_ratio: float | None = None
    kind: str = "capacity"  # capacity | confirm | warmup | shape

    @property
    def passed(self) -> bool:
        return self.valid and self.meets_sla

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def _pcts(values: list[float] | np.ndarray) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {k: None for k in _QUANTILES}
    return {k: float(np.percentile(arr, q)) * 1e3 for k, q in _QUANTILES.items()}


def _metric_values(records: list[RequestRecord], metric: str) -> np.ndarray:
    if metric == "ttft":
        return np.asarray([r.ttft_s for r in records if r.ttft_s is not None], dtype=float)
    if metric == "e2e":
        return np.asarray([r.e2e_s for r in records if r.e2e_s is not None], dtype=float)
    if metric == "tpot":
        return np.asarray([t for r in records if (t := r.tpot_s) is not None], dtype=float)
    if metric == "itl":
        return np.asarray([g for r in records for g in r.itl_s], dtype=float)
    raise ValueError(f"unknown SLA metric {metric!r}")


def _request_meets(r: RequestRecord, term: SLATerm) -> bool:
    """Per-request reading of an SLA term (for goodput): the request's own value within the bound."""
    bound = term.max_ms / 1e3
    if term.metric == "ttft":
        return r.ttft_s is not None and r.ttft_s <= bound
    if term.metric == "e2e":
        return r.e2e_s is not None and r.e2e_s <= bound
    if term.metric == "tpot":
        t = r.tpot_s
        return t is None or t <= bound  # single-token outputs have no TPOT to violate
    if not r.itl_s:  # itl: the request's own gaps at the term's quantile
        return True
    return float(np.percentile(r.itl_s, term.quantile)) <= bound


def good_request(r: RequestRecord, sla: SLA) -> bool:
    return r.status == "ok" and all(_request_meets(r, t) for t in sla.terms)


# Smallest rise of the late arrivals' median TTFT that counts as queueing (see _queue_growth).
_GROWTH_FLOOR_S = 0.1


def _queue_growth(records: list[RequestRecord], window: tuple[float, float]) -> bool:
    """Completion lagging arrivals: the in-flight count keeps rising over the step's window.

    In-flight rises at first anyway while the system fills to its steady level (Little's law: it
    takes about one end-to-end latency), so only the part of the arrival window after
    max(half the window, p95 E2E) is examined; growth = a significant positive slope that adds at
    least half the mean in-flight count, or two requests, across that stretch. Timed-out requests
    count as never finishing. A window too short to leave a fifth of it after the fill is not judged.
    In-flight counts are autocorrelated and noisy with long outputs, so growth must also show in
    latency: the median TTFT of the last quarter's arrivals is 1.5x that of the second quarter's and
    higher by a material amount (``_GROWTH_FLOOR_S``).
    """
    lo, hi = window
    e2e = [r.e2e_s for r in records if r.e2e_s is not None]
    if hi - lo <= 0 or len(records) < 20:
        return False
    fill = float(np.percentile(e2e, 95)) if e2e else 0.0
    start = lo + max((hi - lo) / 2, fill)
    if hi - start < 0.2 * (hi - lo):
        return False
    starts = np.sort([r.sent_s for r in records])
    ends = np.sort([r.end_s if (r.end_s is not None and r.status != "timeout") else math.inf for r in records])
    ts = np.linspace(start, hi, 40)
    inflight = np.searchsorted(starts, ts, side="right") - np.searchsorted(ends, ts, side="right")
    if np.ptp(inflight) == 0:
        return False
    fit = sstats.linregress(ts, inflight)
    rise = fit.slope * (ts[-1] - ts[0])
    if not (fit.slope > 0 and fit.pvalue < 0.01 and rise >= max(2.0, 0.5 * float(np.mean(inflight)))):
        return False
    quarter = (hi - lo) / 4
    mid = [r for r in records if r.status == "ok" and lo + quarter <= r.scheduled_s < lo + 2 * quarter]
    late = [r for r in records if lo + 3 * quarter <= r.scheduled_s]
    # Queueing shows as waiting before the first token. TPOT is not a queue signal: at low load the
    # demo's decode TPOT moved 3.2 -> 8.2 ms between quarters from batch composition alone (a long
    # prefill landing in the batch), which flagged a 2 req/s step on an endpoint serving 20 req/s.
    before = _metric_values(mid, "ttft")
    after = _metric_values([r for r in late if r.status == "ok"], "ttft")
    if before.size and float(np.median(before)) > 0:
        if not after.size:  # the late arrivals never finished: they are still queued
            return True
        b, a = float(np.median(before)), float(np.median(after))
        if a >= 1.5 * b and a - b >= _GROWTH_FLOOR_S:
            return True
    return False


def _steady_throughput(ok: list[RequestRecord], window: tuple[float, float]) -> float | None:
    """Completions per second inside the arrival window once it has filled (after the p95 E2E).

    Dividing all completions by first-send..last-completion (what bench_serving reports) mixes in
    the drain after the last arrival and reads as saturation where there is none. None when the
    window is too short to leave half of it after the fill.
    """
    lo, hi = window
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    if not e2e or hi <= lo:
        return None
    start = lo + float(np.percentile(e2e, 95))
    if hi - start < 0.5 * (hi - lo):
        return None
    n = sum(1 for r in ok if r.end_s is not None and start <= r.end_s <= hi)
    return n / (hi - start)


def summarize_step(outcome: StepOutcome, sla: SLA, *, rate_rps: float, min_completed: int = 0,
                   kind: str = "capacity") -> LoadStep:
    recs = outcome.records
    n = len(recs)
    ok = [r for r in recs if r.status == "ok"]
    n_timeout = sum(1 for r in recs if r.status == "timeout")
    n_failed = n - len(ok) - n_timeout
    sched = sorted(r.scheduled_s for r in recs)
    window = (sched[0], sched[-1]) if sched else (0.0, 0.0)
    span = window[1] - window[0]
    offered = (n - 1) / span if n > 1 and span > 0 else float(rate_rps)
    ends = [r.end_s for r in ok if r.end_s is not None]
    sends = [r.sent_s for r in recs]
    busy_span = (max(ends) - min(sends)) if ends and sends else 0.0
    achieved = _steady_throughput(ok, window)
    if achieved is None:
        achieved = len(ok) / busy_span if busy_span > 0 else 0.0
    error_rate = (n - len(ok)) / n if n else 0.0

    failed_terms: list[str] = []
    ratios: list[float] = []
    missing = False  # a term without samples has no ratio: the step cannot be interpolated
    for term in sla.terms:
        vals = _metric_values(ok, term.metric)
        if vals.size == 0:
            failed_terms.append(f"{term} (no samples)")
            missing = True
            continue
        measured_ms = float(np.percentile(vals, term.quantile)) * 1e3
        ratios.append(measured_ms / term.max_ms)
        if measured_ms > term.max_ms:
            failed_terms.append(f"{term} (measured {measured_ms:.1f}ms)")
    if sla.max_error_rate > 0:
        ratios.append(error_rate / sla.max_error_rate)
    if error_rate > sla.max_error_rate:
        failed_terms.append(f"errors<={sla.max_error_rate * 100:g}% (measured {error_rate * 100:.2f}%)")
    growth = _queue_growth(recs, window)
    if growth:
        failed_terms.append("queue growth (completions lag arrivals)")

    n_good = sum(1 for r in ok if good_request(r, sla))
    invalid = list(outcome.client_invalid_reasons)
    if not failed_terms and len(ok) < min_completed:
        invalid.append(f"only {len(ok)} completed requests < minimum {min_completed}: too few to judge the quantiles")
    return LoadStep(
        step_id=outcome.step_id, rate_rps=float(rate_rps), offered_rps=float(offered), achieved_rps=float(achieved),
        n_sent=n, n_ok=len(ok), n_failed=n_failed, n_timeout=n_timeout,
        ttft_ms=_pcts(_metric_values(ok, "ttft")), itl_ms=_pcts(_metric_values(ok, "itl")),
        tpot_ms=_pcts(_metric_values(ok, "tpot")), e2e_ms=_pcts(_metric_values(ok, "e2e")),
        error_rate=float(error_rate), goodput_rps=achieved * n_good / len(ok) if ok else 0.0,
        meets_sla=not failed_terms, failed_terms=failed_terms, queue_growth=growth,
        valid=not invalid, invalid_reasons=invalid, duration_s=float(outcome.duration_s),
        send_lag_p99_ms=outcome.meta.get("send_lag_p99_ms"),
        sla_attainment=n_good / n if n else 0.0, kind=kind,
        sla_ratio=max(ratios) if ratios and not missing else None,
    )


# ---------------------------------------------------------------- grow + bisect search

# Steps kept for confirmations once one has failed. Near the knee a pass is close to a coin toss and
# the highest pass is the luckiest, so its confirmation often fails; each failure re-bisects the gap
# below it, finds another lucky pass and spends two or three steps, which is how searches used up
# their budget before confirming anything. With this few steps left, lower passes are confirmed as
# they are instead of bisecting above them.
CONFIRM_RESERVE = 3


def grow_bisect(probe: Callable[[float, str], bool], *, start: float, growth: float, resolution: float,
                max_steps: int) -> tuple[float, int]:
    """Highest passing value of a monotone pass/fail probe; returns (value, probes used).

    Grows ``start`` by ``growth`` until a probe fails (or shrinks it until one passes), bisects
    until (hi - lo) <= resolution * lo, then re-probes the final pass with ``kind='confirm'``;
    a failed confirmation lowers the bracket and bisection resumes, except within the last
    ``CONFIRM_RESERVE`` steps, where the next lower pass is confirmed directly. 0.0 when nothing passed.
    """
    if growth <= 1 or resolution <= 0 or start <= 0:
        raise ValueError("need growth > 1, resolution > 0 and start > 0")
    used = 0
    lo, hi = 0.0, math.inf
    passes: list[float] = []

    def run(x: float, kind: str) -> bool:
        nonlocal used
        used += 1
        return probe(x, kind)

    x = start
    while used < max_steps:  # bracket
        if run(x, "capacity"):
            lo = x
            passes.append(x)
            if hi < math.inf:
                break
            x *= growth
        else:
            hi = x
            if lo > 0:
                break
            x /= growth
            if x < start / growth ** 6:  # nothing passes even far below the start: capacity ~ 0
                return 0.0, used
    refuted = False
    while used < max_steps and lo > 0 and hi < math.inf:
        if hi - lo > resolution * lo and not (refuted and max_steps - used <= CONFIRM_RESERVE):
            mid = (lo + hi) / 2
            if run(mid, "capacity"):
                lo = mid
                passes.append(mid)
            else:
                hi = mid
            continue
        if run(lo, "confirm"):
            return lo, used
        hi = lo
        below = [p for p in passes if p < lo]
        refuted = bool(below)
        lo = max(below) if below else lo / growth
        passes = [p for p in passes if p < hi]
    return (lo if hi < math.inf or lo > 0 else 0.0), used


# ---------------------------------------------------------------- interpolated capacity

def interpolate_crossing(points: list[tuple[float, float | None, bool]], *, window: float = 0.25,
                         max_points: int = 12, max_resid: float = 0.3,
                         max_extrapolation: float = 0.05) -> float | None:
    """Rate at which the SLA's worst measured/bound ratio crosses 1, from (rate, sla_ratio, passed) probes.

    Pass/fail near the knee is close to a coin toss, so the highest confirmed pass is one noisy,
    resolution-quantised sample. The ratio itself moves smoothly with rate: log(ratio) is fitted
    linearly against log(rate) over the probes (up to ``max_points``) within ``window`` (relative)
    of the two-point crossing between the highest pass and the lowest failure above it, and the
    fit's root is the estimate, kept within ``max_extrapolation`` (relative) of the fitted probes'
    span. The root may leave the span: when a lucky pass lands on a probe just above the true
    crossing, every probe near the knee lies above it and bisection never probes below; clamping to
    the span then piled 27% of one bank's runs onto that one probe rate (24.0 req/s), so each
    arm's estimate leaned on where its knee fell on the fixed bisection grid. A fit whose RMS residual
    exceeds ``max_resid`` (in log ratio; a cliff rather than a slope, where a straight line would
    put the root anywhere in the window) is not used. With fewer than three such
    probes, or a fit that does not rise, the two-point log-log interpolation is the estimate.
    A failure the ratio does not show (queue growth) caps the estimate at its rate; with only such
    failures above the highest pass the estimate is that pass. None without a pass and a failure
    above it.
    """
    pts = [(float(r), float(q), bool(ok)) for r, q, ok in points if q is not None and q > 0 and r > 0]
    passes = [p for p in pts if p[2]]
    if not passes:
        return None
    lo = max(passes, key=lambda p: p[0])
    shown = [p for p in pts if not p[2] and p[1] > 1 and p[0] > lo[0]]
    hidden_caps = [p[0] for p in pts if not p[2] and p[1] <= 1 and p[0] > lo[0]]
    if not shown:
        return lo[0] if hidden_caps else None
    hi = min(shown, key=lambda p: p[0])
    x_lo, x_hi = math.log(lo[0]), math.log(hi[0])
    y_lo, y_hi = math.log(lo[1]), math.log(hi[1])
    x0 = x_lo + (0.0 - y_lo) / (y_hi - y_lo) * (x_hi - x_lo) if y_hi > y_lo else x_lo
    fit = [p for p in pts if (p[2] or p[1] > 1) and abs(math.log(p[0]) - x0) <= math.log1p(window)]
    fit = sorted(fit, key=lambda p: abs(math.log(p[0]) - x0))[:max_points]
    est = x0
    xs = np.log([p[0] for p in fit])
    if len({round(x, 9) for x in xs}) >= 3 and any(p[1] <= 1 for p in fit) and any(p[1] > 1 for p in fit):
        ys = np.log([p[1] for p in fit])
        slope, intercept = np.polyfit(xs, ys, 1)
        resid = float(np.sqrt(np.mean((ys - (intercept + slope * xs)) ** 2)))
        if slope > 0 and resid <= max_resid:
            ext = math.log1p(max_extrapolation)
            est = min(max(-intercept / slope, float(xs.min()) - ext), float(xs.max()) + ext)
    rate = math.exp(est)
    return min([rate, *hidden_caps])


def interpolate_capacity(steps: list[LoadStep], **kw: Any) -> float | None:
    """``interpolate_crossing`` over a search's valid capacity and confirm steps."""
    return interpolate_crossing([(st.rate_rps, st.sla_ratio, st.passed) for st in steps
                                 if st.kind in ("capacity", "confirm") and st.valid], **kw)


# ---------------------------------------------------------------- capacity

@dataclass
class CapacitySettings:
    step_duration_s: float = 60.0
    min_completed: int = 100
    start_rps: float = 1.0
    growth: float = 2.0
    resolution: float = 0.05
    warmup_s: float = 10.0
    burstiness: float = 1.0
    max_steps: int = 20
    request_timeout_s: float = 120.0
    flush_cache: bool = True
    # > 0: hold each step at least this many times the highest mean E2E latency of the passing steps so
    # far (methods.md §2 asks for 10), so steps near the knee reach their steady state; 0: fixed holds
    hold_e2e_multiple: float = 0.0


@dataclass
class CapacityResult:
    capacity_rps: float
    capacity_rps_per_gpu: float
    steps: list[LoadStep]
    valid: bool
    invalid_reasons: list[str]
    outcomes: list[StepOutcome] = field(default_factory=list, repr=False)
    sla: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    capacity_interp_rps: float | None = None  # interpolate_capacity over the search's steps (None: no crossing)
    warnings: list[str] = field(default_factory=list)  # caveats that do not invalidate the result

    def to_dict(self) -> dict[str, Any]:
        return {"capacity_rps": self.capacity_rps, "capacity_rps_per_gpu": self.capacity_rps_per_gpu,
                "capacity_interp_rps": self.capacity_interp_rps,
                "steps": [s.to_dict() for s in self.steps], "valid": self.valid,
                "invalid_reasons": self.invalid_reasons, "sla": self.sla, "settings": self.settings,
                "n_steps": len([s for s in self.steps if s.kind != "warmup"]), "warnings": self.warnings}


HOLD_E2E_MULTIPLE = 10.0  # methods.md §2: a step's window should be >= 10x the mean E2E latency


def hold_warning(outcome: StepOutcome, *, multiple: float = HOLD_E2E_MULTIPLE) -> str | None:
    """A caveat when a step's arrival window was shorter than ``multiple`` x its mean E2E latency.

    Near saturation the queue fills slowly, so a short hold ends before the step reaches its steady
    state and the SLA holds longer than it would: on the demo endpoint the same search found
    22.6 req/s with 40 s steps, 20.1 with 60 s, 18.5 with 90 s and 17.5 with 120 s (median of 40-120
    emulator runs each; its long outputs put the mean E2E at capacity near 11 s and the p95 near 40-45 s,
    so methods.md's rule asks for steps of about 110 s there).
    """
    sends = [r.scheduled_s for r in outcome.records]
    mean_e2e = _mean_e2e(outcome)
    if mean_e2e <= 0 or len(sends) < 2:
        return None
    window = max(sends) - min(sends)
    if window >= multiple * mean_e2e:
        return None
    return (f"steps held {window:.0f} s at the capacity rate, under {multiple:g}x its mean E2E latency "
            f"({mean_e2e:.1f} s): the queue may not have reached its steady state, so the capacity may be "
            f"optimistic; longer steps (--step-duration, or --hold-e2e-multiple {multiple:g}) measure the "
            f"sustained rate")


def _step_duration(rate: float, s: CapacitySettings, mean_e2e_s: float = 0.0) -> float:
    """Hold long enough for the duration AND the minimum number of completed requests (10% headroom),
    and, with ``hold_e2e_multiple``, for that many mean E2E latencies of the passing steps so far
    (25% headroom: latency still rises toward the knee; on the demo the mean E2E went from 9 s at
    16 req/s to 11 s at its 22 req/s capacity)."""
    return max(s.step_duration_s, 1.1 * s.min_completed / rate, 1.25 * s.hold_e2e_multiple * mean_e2e_s)


def _mean_e2e(outcome: StepOutcome) -> float:
    e2e = [r.e2e_s for r in outcome.records if r.status == "ok" and r.e2e_s is not None]
    return float(np.mean(e2e)) if e2e else 0.0


def _confirmed(steps: list[LoadStep], value: float) -> bool:
    return any(st.kind == "confirm" and st.passed and math.isclose(st.rate_rps, value) for st in steps)


def _announce(progress: Any, step_id: str, n: int, span_s: float) -> None:
    """Tell a progress reporter that a step starts (optional ``step_started`` method)."""
    start = getattr(progress, "step_started", None)
    if start is not None:
        start(step_id, n, span_s)


def find_capacity(deployment: Deployment, pool: Any, sla: SLA, *, gpus: int, model: str,
                  settings: CapacitySettings | None = None, seed: int = 0,
                  progress: Callable[[LoadStep], None] | None = None) -> CapacityResult:
    s = settings or CapacitySettings()
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    steps: list[LoadStep] = []
    outcomes: list[StepOutcome] = []
    cursor = [0]  # pool position: each step replays the next requests of the pool
    held_e2e = [0.0]  # highest mean E2E of a passing measured step so far (the hold_e2e_multiple basis)

    def execute(rate: float, duration: float, kind: str, min_completed: int) -> LoadStep:
        k = len(steps)
        step_seed = seed * 1000 + k
        if s.flush_cache:
            deployment.flush_cache()
        offsets = poisson_offsets(rate, duration, seed=step_seed, burstiness=s.burstiness)
        for _ in range(8):  # a Poisson draw can fall short of the minimum: hold the step longer
            if len(offsets) >= min_completed:
                break
            duration *= 1.25
            offsets = poisson_offsets(rate, duration, seed=step_seed, burstiness=s.burstiness)
        sched = build_schedule(pool, offsets, model=model, seed=step_seed, start_index=cursor[0])
        cursor[0] += len(sched)
        step_id = f"{kind}{k:02d}-{rate:.4g}rps"
        _announce(progress, step_id, len(sched), sched[-1].send_offset_s if sched else 0.0)
        outcome = deployment.run_step(sched, step_id=step_id, timeout_s=s.request_timeout_s)
        step = summarize_step(outcome, sla, rate_rps=rate, min_completed=min_completed, kind=kind)
        steps.append(step)
        outcomes.append(outcome)
        if kind != "warmup" and step.passed:
            held_e2e[0] = max(held_e2e[0], _mean_e2e(outcome))
        if progress:
            progress(step)
        return step

    if s.warmup_s > 0:
        execute(s.start_rps, s.warmup_s, "warmup", 0)

    def probe(rate: float, kind: str) -> bool:
        return execute(rate, _step_duration(rate, s, held_e2e[0]), kind, s.min_completed).passed

    capacity, _ = grow_bisect(probe, start=s.start_rps, growth=s.growth, resolution=s.resolution,
                              max_steps=s.max_steps)
    measured = [st for st in steps if st.kind != "warmup"]
    reasons = [f"{st.step_id}: {r}" for st in measured for r in st.invalid_reasons]
    if capacity > 0 and not _confirmed(measured, capacity):
        reasons.append(f"search stopped after {s.max_steps} steps before confirming a capacity")
    at_capacity = [o for st, o in zip(steps, outcomes)
                   if st.kind in ("capacity", "confirm") and st.passed and math.isclose(st.rate_rps, capacity)]
    warning = hold_warning(at_capacity[-1]) if at_capacity else None
    return CapacityResult(capacity_rps=capacity, capacity_rps_per_gpu=capacity / gpus, steps=steps,
                          valid=not reasons, invalid_reasons=reasons, outcomes=outcomes, sla=str(sla),
                          settings=asdict(s), capacity_interp_rps=interpolate_capacity(measured),
                          warnings=[warning] if warning else [])


def linear_ramp_steps(capacity: float, *, start: float, resolution: float) -> int:
    """Steps a linear ramp from ``start`` needs to locate ``capacity`` to ``resolution`` (for comparison)."""
    increment = resolution * capacity
    return int(math.ceil(max(capacity - start, 0.0) / increment)) + 1


# ---------------------------------------------------------------- production shape

@dataclass
class ShapeResult:
    speedup: float | None  # the speed-up replayed (the confirmed replay capacity when searching)
    replay_capacity: float | None  # largest speed-up meeting the SLA (None unless searched)
    meets_sla: bool
    intervals: list[dict[str, Any]]  # per replay interval: target rate, sent, ok, attainment, p99s, meets_sla
    steps: list[LoadStep]
    valid: bool
    invalid_reasons: list[str]
    autoscaling: dict[str, Any] | None
    outcomes: list[StepOutcome] = field(default_factory=list, repr=False)
    sla: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"replay_capacity": self.replay_capacity, "speedup": self.speedup, "meets_sla": self.meets_sla,
                "intervals": self.intervals, "steps": [s.to_dict() for s in self.steps], "valid": self.valid,
                "invalid_reasons": self.invalid_reasons, "autoscaling": self.autoscaling, "sla": self.sla}


def interval_attainment(outcome: StepOutcome, sla: SLA, *, replay_interval_s: float,
                        target_counts: list[int], speedup: float) -> list[dict[str, Any]]:
    """Per replay interval: target rate, requests sent/ok, SLA attainment and the interval's own verdict."""
    rows = []
    buckets: dict[int, list[RequestRecord]] = {}
    for r in outcome.records:
        buckets.setdefault(int(r.scheduled_s // replay_interval_s), []).append(r)
    for k, target in enumerate(target_counts):
        recs = buckets.get(k, [])
        ok = [r for r in recs if r.status == "ok"]
        good = sum(1 for r in ok if good_request(r, sla))
        ttft = _metric_values(ok, "ttft")
        tpot = _metric_values(ok, "tpot")
        meets = bool(recs) and all(
            (v := _metric_values(ok, t.metric)).size > 0 and float(np.percentile(v, t.quantile)) * 1e3 <= t.max_ms
            for t in sla.terms) and (len(recs) - len(ok)) / len(recs) <= sla.max_error_rate
        rows.append({
            "interval": k, "start_s": k * replay_interval_s, "target_rps": target / replay_interval_s,
            "original_rps": target / (replay_interval_s * speedup), "sent": len(recs), "ok": len(ok),
            "attainment": good / len(recs) if recs else None,
            "ttft_p99_ms": float(np.percentile(ttft, 99)) * 1e3 if ttft.size else None,
            "tpot_p99_ms": float(np.percentile(tpot, 99)) * 1e3 if tpot.size else None,
            "meets_sla": meets if recs else None,
        })
    return rows


def autoscaling_report(timeseries: list[dict[str, Any]], intervals: list[dict[str, Any]], *,
                       replay_interval_s: float, gpus_per_replica: int) -> dict[str, Any] | None:
    """GPU-seconds used and how fast replicas followed bursts, from a ``replicas`` timeseries.

    Rows carry the step-relative time as ``t_s`` (the HTTP runner's /metrics scrape) or ``t`` (the
    emulator's virtual-time samples).

    A burst is an interval whose target rate is at least 1.5x the previous one; its follow time is
    how long after the interval started the replica count first rose above its level at that start
    (None when it never rose before the replay ended). Returns None when the engine reports no replicas.
    """
    pts = sorted((float(r.get("t_s", r.get("t"))), float(r["replicas"])) for r in timeseries
                 if "replicas" in r and ("t_s" in r or "t" in r))
    if len(pts) < 2:
        return None
    t = np.asarray([p[0] for p in pts])
    rep = np.asarray([p[1] for p in pts])
    gpu_seconds = float(np.sum(rep[:-1] * np.diff(t))) * gpus_per_replica
    follows = []
    for prev, cur in zip(intervals, intervals[1:]):
        if prev["target_rps"] > 0 and cur["target_rps"] >= 1.5 * prev["target_rps"]:
            start = cur["start_s"]
            level = rep[max(0, int(np.searchsorted(t, start, side="right")) - 1)]
            later = np.nonzero((t >= start) & (rep > level))[0]
            follows.append({"interval": cur["interval"], "start_s": start,
                            "follow_s": float(t[later[0]] - start) if later.size else None})
    followed = [f["follow_s"] for f in follows if f["follow_s"] is not None]
    return {"gpu_seconds": gpu_seconds, "replicas_min": float(rep.min()), "replicas_max": float(rep.max()),
            "bursts": follows, "median_follow_s": float(np.median(followed)) if followed else None,
            "bursts_not_followed": len(follows) - len(followed)}


def run_shape(deployment: Deployment, pool: Any, sla: SLA, *, gpus: int, model: str, speedup: float | None = None,
              search: bool = False, interval_s: float = 60.0, seed: int = 0, request_timeout_s: float = 120.0,
              growth: float = 2.0, resolution: float = 0.05, max_steps: int = 12, flush_cache: bool = True,
              gpus_per_replica: int | None = None,
              progress: Callable[[LoadStep], None] | None = None) -> ShapeResult:
    if not search and speedup is None:
        speedup = 1.0
    arrivals = [float(r.arrival_s) for r in pool.iter_requests("serving")]
    _, counts = interval_counts(arrivals, interval_s)
    steps: list[LoadStep] = []
    outcomes: list[StepOutcome] = []
    details: dict[float, tuple[StepOutcome, LoadStep]] = {}

    def replay(x: float, kind: str) -> LoadStep:
        k = len(steps)
        if flush_cache:
            deployment.flush_cache()
        offsets = shape_offsets(pool, speedup=x, interval_s=interval_s, seed=seed * 1000 + k)
        sched = build_schedule(pool, offsets, model=model, seed=seed * 1000 + k, aligned=True)
        step_id = f"shape{k:02d}-x{x:.4g}"
        _announce(progress, step_id, len(sched), sched[-1].send_offset_s if sched else 0.0)
        outcome = deployment.run_step(sched, step_id=step_id, timeout_s=request_timeout_s)
        step = summarize_step(outcome, sla, rate_rps=x, kind="shape" if kind == "capacity" else kind)
        steps.append(step)
        outcomes.append(outcome)
        details[x] = (outcome, step)
        if progress:
            progress(step)
        return step

    replay_capacity = None
    if search:
        replay_capacity, _ = grow_bisect(lambda x, kind: replay(x, kind).passed, start=speedup or 1.0,
                                         growth=growth, resolution=resolution, max_steps=max_steps)
        chosen = replay_capacity if replay_capacity and replay_capacity in details else None
        if chosen is None:  # nothing passed: report the slowest replay tried
            chosen = min(details)
        speedup = chosen
    else:
        replay(speedup, "capacity")
    outcome, step = details[speedup]
    replay_interval = interval_s / speedup
    intervals = interval_attainment(outcome, sla, replay_interval_s=replay_interval, target_counts=counts,
                                    speedup=speedup)
    auto = autoscaling_report(outcome.engine_timeseries, intervals, replay_interval_s=replay_interval,
                              gpus_per_replica=gpus_per_replica or gpus)
    reasons = [f"{st.step_id}: {r}" for st in steps for r in st.invalid_reasons]
    if search and replay_capacity and not _confirmed(steps, replay_capacity):
        reasons.append(f"search stopped after {max_steps} steps before confirming a replay capacity")
    return ShapeResult(speedup=speedup, replay_capacity=replay_capacity, meets_sla=step.meets_sla,
                       intervals=intervals, steps=steps, valid=not reasons, invalid_reasons=reasons,
                       autoscaling=auto, outcomes=outcomes, sla=str(sla))
