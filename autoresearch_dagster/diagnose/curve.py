"""Owns load-curve analysis: the knee, which SLA term breaks first, and whether queueing or per-token time grows.

Input: the runner's ``CapacityResult`` (or its ``to_dict()``, or a list of ``LoadStep``s). Growth
is measured from the lightest valid step to the first step that misses the SLA (or the heaviest
step when none misses): TTFT growing much faster than TPOT means requests wait (admission or
queueing); TPOT/ITL growing means each token costs more as the batch grows (compute or memory).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autoresearch_dagster.spec import SLA

TERMS = ("ttft", "itl", "tpot", "e2e", "errors")


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _pct(step: Any, metric: str, q: str) -> float | None:
    d = _get(step, f"{metric}_ms") or {}
    v = d.get(q) if isinstance(d, dict) else None
    return float(v) if v is not None else None


def _term_of(failed: str) -> str:
    s = str(failed).lower()
    for t in ("ttft", "itl", "tpot", "e2e"):
        if t in s:
            return t
    if "err" in s:
        return "errors"
    return "queue" if "queue" in s else s


@dataclass
class CurveAnalysis:
    n_steps: int
    capacity_rps: float | None
    knee_rps: float | None  # highest rate that met the SLA below the first one that missed it
    break_rps: float | None  # lowest rate that missed it
    first_broken: list[str]  # SLA terms missed at break_rps (ttft, itl, tpot, e2e, errors, queue)
    low_rps: float | None
    ttft_growth: float | None  # p50 TTFT at break (or heaviest) / at the lightest step
    tpot_growth: float | None
    itl_tail_ratio: float | None  # ITL p99 / p50 at the break step (decode stalls show here)
    queue_growth: bool | None  # the runner's backlog flag at the break step
    achieved_ratio: float | None  # achieved / offered at the break step
    headroom_low: dict[str, float]  # latency / SLA limit per term at the lightest step
    headroom_break: dict[str, float]
    regime: str  # queueing | per_token | errors | none

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _headroom(step: Any, sla: SLA | None) -> dict[str, float]:
    out: dict[str, float] = {}
    if step is None or sla is None:
        return out
    for t in sla.terms:
        q = f"p{int(t.quantile)}" if float(t.quantile).is_integer() else f"p{t.quantile}"
        v = _pct(step, t.metric, q) or _pct(step, t.metric, "p99")
        if v is not None:
            out[t.metric] = max(out.get(t.metric, 0.0), v / t.max_ms)
    err = _get(step, "error_rate")
    if err is not None and sla.max_error_rate > 0:
        out["errors"] = float(err) / sla.max_error_rate
    return out


def analyze_curve(capacity: Any, sla: SLA | None = None) -> CurveAnalysis:
    steps_raw = list(_get(capacity, "steps", capacity) or [])
    steps = sorted([s for s in steps_raw if _get(s, "valid", True) and _get(s, "kind", "capacity") != "warmup"],
                   key=lambda s: float(_get(s, "rate_rps", 0.0)))
    cap = _get(capacity, "capacity_rps") if not isinstance(capacity, list) else None
    if not steps:
        return CurveAnalysis(0, cap, None, None, [], None, None, None, None, None, None, {}, {}, "none")
    passing = [s for s in steps if _get(s, "meets_sla")]
    failing = [s for s in steps if not _get(s, "meets_sla")]
    brk = failing[0] if failing else None
    low = steps[0]
    ref = brk if brk is not None else steps[-1]
    # A noisy search can pass above a failed rate; the knee is the last pass below the first failure.
    below = [s for s in passing if brk is None or float(_get(s, "rate_rps")) < float(_get(brk, "rate_rps"))]

    def growth(metric: str) -> float | None:
        a, b = _pct(low, metric, "p50"), _pct(ref, metric, "p50")
        return b / a if a and b is not None and a > 0 else None

    first = sorted({_term_of(f) for f in (_get(brk, "failed_terms") or [])}) if brk is not None else []
    tg, pg = growth("ttft"), growth("tpot")
    itl50, itl99 = _pct(ref, "itl", "p50"), _pct(ref, "itl", "p99")
    qg = _get(brk, "queue_growth") if brk is not None else None
    offered, achieved = _get(ref, "offered_rps"), _get(ref, "achieved_rps")
    if brk is None:
        regime = "none"
    elif first and all(t in ("errors",) for t in first):
        regime = "errors"
    elif (pg or 1.0) >= 1.5 and (tg or 1.0) < 3.0 * (pg or 1.0):
        regime = "per_token"
    elif (tg or 1.0) >= 1.5 or qg:
        regime = "queueing"
    else:
        regime = "per_token" if any(t in ("tpot", "itl") for t in first) else "queueing"
    return CurveAnalysis(
        n_steps=len(steps), capacity_rps=float(cap) if cap is not None else None,
        knee_rps=float(_get(below[-1], "rate_rps")) if below else None,
        break_rps=float(_get(brk, "rate_rps")) if brk is not None else None,
        first_broken=first, low_rps=float(_get(low, "rate_rps")),
        ttft_growth=tg, tpot_growth=pg,
        itl_tail_ratio=(itl99 / itl50) if itl50 and itl99 is not None and itl50 > 0 else None,
        queue_growth=(bool(qg) if qg is not None else None),
        achieved_ratio=(float(achieved) / float(offered)) if offered and achieved is not None else None,
        headroom_low=_headroom(low, sla), headroom_break=_headroom(ref, sla), regime=regime)
