"""Owns one load step: sending a schedule to a deployment, and the step's statistics.

Everything here works on ``StepOutcome`` records through the ``Deployment`` protocol only
(``run_step``), so the same code measures the emulator's virtual-time engine, its HTTP server, a
local SGLang or any OpenAI-compatible URL.

- ``poisson_step``: one open-loop Poisson (or gamma-bursty) step at rate r: ``step_offsets`` (the
  draw, held longer until it sends the step's minimum) then ``run_offsets``. The capacity search,
  diagnosis and its probes run it; the experiments' reference step and the calibration's
  predictions draw with ``step_offsets`` themselves (they place the pool window by the draw's
  length). ``run_offsets`` also sends offsets drawn elsewhere (warm-up spacing, the production
  shape); it is the one place that calls ``Deployment.run_step``.
- ``summarize_step``: one load step → offered/achieved rate, p50/p95/p99 TTFT/ITL/TPOT/E2E, error
  rate, goodput (req/s meeting every SLA term), queue growth, validity.

One timeout rule: every request of every step gets the measurement profile's
``request_timeout_s`` (``profiles.CapacitySettings``; ``REQUEST_TIMEOUT_S`` = 120 s in every named
profile) as its per-request timeout, and the step ends at its last send offset plus that timeout (how
``Deployment.run_step`` reads ``timeout_s``). A request still running then is recorded as a
timeout, which is an error against the SLA's error limit. Why one per-request bound and not one per
caller: the step's verdict reads latency quantiles over the completed requests and the error rate
over all of them, so the timeout decides which slow requests are latency samples and which are
errors. Timeouts that grew with the step's length (``max(120, 4 x duration + 120)``,
``max(300, 10 x duration)``) let the same server state count as a slow success in a long step and
as an error in a short one, and made the reference step, diagnosis and the calibration's
predictions judge by other rules than the capacity search whose steps they are compared with
(calibration fits the emulator to measured steps, which had the profile's timeout). A bound tied
to the profile, not to the duration, is also what any client of the endpoint sees.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sstats

from autoresearch_dagster.engines.base import Deployment
from autoresearch_dagster.loadgen.records import RequestRecord, ScheduledRequest, StepOutcome
from autoresearch_dagster.loadgen.schedule import build_schedule, poisson_offsets
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
    # How a Poisson step's sends were drawn (``poisson_step``), so the same traffic can be replayed elsewhere (the
    # emulator's calibration, ``arrival_offsets``): the generator's seed, the first pool row, the burstiness.
    arrival_seed: int | None = None
    start_index: int | None = None
    burstiness: float | None = None

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


def metric_values(records: list[RequestRecord], metric: str) -> np.ndarray:
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
    before = metric_values(mid, "ttft")
    after = metric_values([r for r in late if r.status == "ok"], "ttft")
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
        vals = metric_values(ok, term.metric)
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
        ttft_ms=_pcts(metric_values(ok, "ttft")), itl_ms=_pcts(metric_values(ok, "itl")),
        tpot_ms=_pcts(metric_values(ok, "tpot")), e2e_ms=_pcts(metric_values(ok, "e2e")),
        error_rate=float(error_rate), goodput_rps=achieved * n_good / len(ok) if ok else 0.0,
        meets_sla=not failed_terms, failed_terms=failed_terms, queue_growth=growth,
        valid=not invalid, invalid_reasons=invalid, duration_s=float(outcome.duration_s),
        send_lag_p99_ms=outcome.meta.get("send_lag_p99_ms"),
        sla_attainment=n_good / n if n else 0.0, kind=kind,
        sla_ratio=max(ratios) if ratios and not missing else None,
    )



# ---------------------------------------------------------------- running one step

@dataclass
class StepRun:
    schedule: list[ScheduledRequest]
    outcome: StepOutcome
    step: LoadStep


def _announce(progress: Any, step_id: str, n: int, span_s: float) -> None:
    """Tell a progress reporter that a step starts (optional ``step_started`` method)."""
    start = getattr(progress, "step_started", None)
    if start is not None:
        start(step_id, n, span_s)


def run_offsets(deployment: Deployment, pool: Any, offsets: list[float], sla: SLA, *, rate_rps: float, model: str,
                seed: int, step_id: str, request_timeout_s: float, start_index: int = 0, aligned: bool = False,
                flush_cache: bool = False, kind: str = "capacity", min_completed: int = 0,
                progress: Any = None) -> StepRun:
    """Send the pool's requests at ``offsets`` (``build_schedule``), each with ``request_timeout_s``
    (the profile's: the one timeout rule), and summarise the step."""
    if flush_cache:
        deployment.flush_cache()
    sched = build_schedule(pool, offsets, model=model, seed=seed, start_index=start_index, aligned=aligned)
    _announce(progress, step_id, len(sched), sched[-1].send_offset_s if sched else 0.0)
    outcome = deployment.run_step(sched, step_id=step_id, timeout_s=request_timeout_s)
    step = summarize_step(outcome, sla, rate_rps=rate_rps, min_completed=min_completed, kind=kind)
    return StepRun(schedule=sched, outcome=outcome, step=step)


def step_offsets(rate_rps: float, duration_s: float, *, seed: int, burstiness: float = 1.0,
                 min_requests: int = 1) -> list[float]:
    """Poisson send offsets over ``duration_s``, held longer (x1.25, up to 8 times) when the draw falls
    short of ``min_requests``; a single send at 0 when even that draws nothing."""
    offsets = poisson_offsets(rate_rps, duration_s, seed=seed, burstiness=burstiness)
    for _ in range(8):
        if len(offsets) >= min_requests:
            break
        duration_s *= 1.25
        offsets = poisson_offsets(rate_rps, duration_s, seed=seed, burstiness=burstiness)
    return offsets or [0.0]


def poisson_step(deployment: Deployment, pool: Any, sla: SLA, *, rate_rps: float, duration_s: float, model: str,
                 seed: int, step_id: str, request_timeout_s: float, burstiness: float = 1.0, start_index: int = 0,
                 flush_cache: bool = False, kind: str = "capacity", min_completed: int = 0,
                 progress: Any = None) -> StepRun:
    """One load step at ``rate_rps`` for ``duration_s`` (at least ``min_completed`` requests sent)."""
    offsets = step_offsets(rate_rps, duration_s, seed=seed, burstiness=burstiness, min_requests=min_completed)
    run = run_offsets(deployment, pool, offsets, sla, rate_rps=rate_rps, model=model, seed=seed, step_id=step_id,
                      request_timeout_s=request_timeout_s, start_index=start_index, flush_cache=flush_cache,
                      kind=kind, min_completed=min_completed, progress=progress)
    run.step.arrival_seed, run.step.start_index, run.step.burstiness = seed, start_index, float(burstiness)
    return run


def arrival_offsets(rate_rps: float, n: int, *, seed: int, burstiness: float = 1.0) -> list[float]:
    """The first ``n`` send offsets of the arrival stream ``step_offsets`` draws for (rate, seed, burstiness): the
    sends of a step that sent ``n``, however long it held (the draws continue one generator, so a longer hold only
    appends to the same stream)."""
    if n < 1:
        return []
    duration = (1.5 * n + 10) / rate_rps
    while True:
        offsets = poisson_offsets(rate_rps, duration, seed=seed, burstiness=burstiness)
        if len(offsets) >= n:
            return offsets[:n]
        duration *= 2
