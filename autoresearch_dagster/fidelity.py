"""Owns replay fidelity: workload statistics of a source log and of a pool, and their comparison.

Statistics (methods.md §5): prompt/output token-length distributions (KS distance, p50/p99/mean
ratios), prefix reuse (hit rate of an infinite prefix cache over chained block hashes), arrival
process (mean rate, CV of inter-arrival times, index of dispersion of counts at 1/10/60 s), and
concurrency (time-weighted mean and p95 of in-flight requests) when the log has timings. The
source side is collected from records as read, before redaction or synthesis changes them.
"""
from __future__ import annotations

from array import array
from dataclasses import asdict, dataclass, field
from typing import Iterable

import numpy as np
from scipy.stats import ks_2samp


@dataclass
class FidelityThresholds:
    ks_max: float = 0.05            # two-sample KS distance of token lengths
    p50_tol: float = 0.05           # |pool p50 / source p50 - 1|
    p99_tol: float = 0.10
    mean_tol: float = 0.02
    prefix_hit_pp: float = 2.0      # percentage points of infinite-cache prefix hit rate
    rate_tol: float = 0.10          # mean arrival rate ratio
    cv_tol: float = 0.10            # CV of inter-arrival times, ratio
    idc_tol: float = 0.20           # index of dispersion of counts, ratio
    concurrency_tol: float = 0.10   # time-weighted mean and p95 of in-flight requests, ratio
    token_change_max: float = 0.01  # |total prompt tokens after redaction / before - 1|
    min_windows: int = 5            # IDC at T needs at least this many whole windows of T
    min_split_requests: int = 200   # the serving-split KS check is sampling noise below this many requests
    idc_windows_s: tuple[float, ...] = (1.0, 10.0, 60.0)

    def to_dict(self) -> dict:
        return asdict(self)


class PrefixCache:
    """Infinite prefix cache over chained block hashes: a hit is a block whose hash was seen before."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self.hits = 0
        self.total = 0

    def add(self, hashes: Iterable[int]) -> None:
        seen = self._seen
        for h in hashes:
            self.total += 1
            if h in seen:
                self.hits += 1
            else:
                seen.add(h)

    def add_flat(self, hashes: np.ndarray, unique: np.ndarray | None = None) -> None:
        """The hashes of many requests at once (``unique``: np.unique of them, if already known)."""
        if not len(hashes):
            return
        seen = self._seen
        new = [h for h in (np.unique(hashes) if unique is None else unique).tolist() if h not in seen]
        self.total += len(hashes)
        self.hits += len(hashes) - len(new)  # each id's first occurrence misses unless seen before
        seen.update(new)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.total if self.total else 0.0


@dataclass
class WorkloadStats:
    """Per-request samples of one side of the comparison, collected incrementally (bounded per request)."""
    arrivals: array = field(default_factory=lambda: array("d"))
    prompt_tokens: array = field(default_factory=lambda: array("q"))
    output_tokens: array = field(default_factory=lambda: array("q"))
    latencies: array | None = None  # NaN where unknown; None until a request has a latency
    cache: PrefixCache = field(default_factory=PrefixCache)

    def add(self, arrival_s: float, prompt_tokens: int, output_tokens: int, hashes: Iterable[int] = (),
            latency_s: float | None = None) -> None:
        self.arrivals.append(arrival_s)
        self.prompt_tokens.append(prompt_tokens)
        self.output_tokens.append(output_tokens)
        if latency_s is not None and self.latencies is None:
            self.latencies = array("d", [float("nan")]) * (len(self.arrivals) - 1)
        if self.latencies is not None:
            self.latencies.append(float("nan") if latency_s is None else latency_s)
        self.cache.add(hashes)

    def add_many(self, arrivals: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 hashes: np.ndarray | None = None, unique: np.ndarray | None = None) -> None:
        self.arrivals.frombytes(np.ascontiguousarray(arrivals, np.float64).tobytes())
        self.prompt_tokens.frombytes(np.ascontiguousarray(prompt_tokens, np.int64).tobytes())
        self.output_tokens.frombytes(np.ascontiguousarray(output_tokens, np.int64).tobytes())
        if self.latencies is not None:
            self.latencies.frombytes(np.full(len(arrivals), np.nan).tobytes())
        if hashes is not None:
            self.cache.add_flat(hashes, unique)

    def __len__(self) -> int:
        return len(self.arrivals)


def _idc(t: np.ndarray, window: float, min_windows: int) -> float | None:
    span = t[-1] - t[0]
    k = int(span // window)
    if k < min_windows:
        return None
    counts = np.bincount(((t - t[0]) // window).astype(np.int64), minlength=k)[:k]
    mean = counts.mean()
    return float(counts.var() / mean) if mean > 0 else None


def _concurrency(arr: np.ndarray, lat: np.ndarray) -> tuple[float, float] | None:
    ok = ~np.isnan(lat)
    if ok.sum() < max(2, 0.5 * len(lat)):
        return None
    starts, ends = arr[ok], arr[ok] + lat[ok]
    times = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.lexsort((delta, times))  # ends before starts at equal times
    times, delta = times[order], delta[order]
    level = np.cumsum(delta)[:-1]
    dur = np.diff(times)
    if dur.sum() <= 0:
        return None
    mean = float((level * dur).sum() / dur.sum())
    o = np.argsort(level)
    cum = np.cumsum(dur[o]) / dur.sum()
    p95 = float(level[o][np.searchsorted(cum, 0.95)])
    return mean, p95


def summarize(ws: WorkloadStats, th: FidelityThresholds | None = None) -> dict:
    """The statistics of one side, as plain numbers."""
    th = th or FidelityThresholds()
    arr = np.sort(np.frombuffer(ws.arrivals, dtype=np.float64)) if len(ws) else np.zeros(0)
    out: dict = {"requests": len(ws), "prefix_hit_rate": ws.cache.hit_rate}
    for name, a in (("prompt_tokens", ws.prompt_tokens), ("output_tokens", ws.output_tokens)):
        x = np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0)
        out[name] = ({"mean": float(x.mean()), "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99))}
                     if len(x) else None)
    if len(arr) >= 2 and arr[-1] > arr[0]:
        gaps = np.diff(arr)
        out["arrival"] = {"duration_s": float(arr[-1] - arr[0]), "rate_rps": float((len(arr) - 1) / (arr[-1] - arr[0])),
                          "cv": float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else None}
        for w in th.idc_windows_s:
            out["arrival"][f"idc_{w:g}s"] = _idc(arr, w, th.min_windows)
    conc = None
    if len(ws) and ws.latencies is not None:
        conc = _concurrency(np.frombuffer(ws.arrivals, dtype=np.float64), np.frombuffer(ws.latencies, dtype=np.float64))
    out["concurrency"] = {"mean": conc[0], "p95": conc[1]} if conc else None
    return out


def _ratio_check(name: str, src: float | None, pool: float | None, tol: float) -> dict:
    if src is None or pool is None:
        return {"value": None, "threshold": tol, "passed": True, "skipped": "not enough data on one side"}
    if src == 0:
        ratio = 1.0 if pool == 0 else float("inf")
    else:
        ratio = pool / src
    passed = abs(ratio - 1) <= tol + 1e-12
    check = {"value": round(ratio, 6), "threshold": tol, "passed": passed, "source": src, "pool": pool}
    if not passed:
        check["message"] = (f"{name}: pool/source = {ratio:.4f} (source {src:.4g}, pool {pool:.4g}); allowed 1 ± {tol:g}, "
                            f"off by {abs(ratio - 1) - tol:.4f} beyond the tolerance")
    return check


def ks_check(name: str, a: array, b: array, limit: float) -> dict:
    if len(a) == 0 or len(b) == 0:
        return {"value": None, "threshold": limit, "passed": True, "skipped": "no samples on one side"}
    d = float(ks_2samp(np.frombuffer(a, dtype=np.int64), np.frombuffer(b, dtype=np.int64)).statistic)
    check = {"value": round(d, 6), "threshold": limit, "passed": d <= limit}
    if d > limit:
        check["message"] = f"{name}: KS distance {d:.4f} > {limit:g} (by {d - limit:.4f})"
    return check


def compare(source: WorkloadStats, pool: WorkloadStats, th: FidelityThresholds | None = None,
            *, extra: dict[str, dict] | None = None) -> dict:
    """``{"passed", "checks": {name: {"value", "threshold", "passed", ...}}, "failures": [...], ...}``."""
    th = th or FidelityThresholds()
    s, p = summarize(source, th), summarize(pool, th)
    checks: dict[str, dict] = {}
    for name in ("prompt_tokens", "output_tokens"):
        checks[f"{name}.ks"] = ks_check(f"{name}.ks", getattr(source, name), getattr(pool, name), th.ks_max)
        for stat, tol in (("p50", th.p50_tol), ("p99", th.p99_tol), ("mean", th.mean_tol)):
            sv = s[name][stat] if s[name] else None
            pv = p[name][stat] if p[name] else None
            checks[f"{name}.{stat}_ratio"] = _ratio_check(f"{name}.{stat}_ratio", sv, pv, tol)
    dpp = 100 * (p["prefix_hit_rate"] - s["prefix_hit_rate"])
    checks["prefix_hit_rate.delta_pp"] = {"value": round(dpp, 4), "threshold": th.prefix_hit_pp,
                                          "passed": abs(dpp) <= th.prefix_hit_pp,
                                          "source": s["prefix_hit_rate"], "pool": p["prefix_hit_rate"]}
    if abs(dpp) > th.prefix_hit_pp:
        checks["prefix_hit_rate.delta_pp"]["message"] = (
            f"prefix_hit_rate.delta_pp: pool {100 * p['prefix_hit_rate']:.2f}% vs source {100 * s['prefix_hit_rate']:.2f}% "
            f"differs by {abs(dpp):.2f} pp > {th.prefix_hit_pp:g} pp")
    sa, pa_ = s.get("arrival") or {}, p.get("arrival") or {}
    checks["arrival.rate_ratio"] = _ratio_check("arrival.rate_ratio", sa.get("rate_rps"), pa_.get("rate_rps"), th.rate_tol)
    checks["arrival.cv_ratio"] = _ratio_check("arrival.cv_ratio", sa.get("cv"), pa_.get("cv"), th.cv_tol)
    for w in th.idc_windows_s:
        key = f"idc_{w:g}s"
        checks[f"arrival.{key}_ratio"] = _ratio_check(f"arrival.{key}_ratio", sa.get(key), pa_.get(key), th.idc_tol)
    if s["concurrency"] or p["concurrency"]:
        for stat in ("mean", "p95"):
            checks[f"concurrency.{stat}_ratio"] = _ratio_check(
                f"concurrency.{stat}_ratio", (s["concurrency"] or {}).get(stat), (p["concurrency"] or {}).get(stat),
                th.concurrency_tol)
    checks.update(extra or {})
    failures = [c.get("message", name) for name, c in checks.items() if not c["passed"]]
    return {"passed": not failures, "checks": checks, "failures": failures, "source": s, "pool": p,
            "thresholds": th.to_dict()}


def token_change_check(source_total: int, pool_total: int, th: FidelityThresholds | None = None) -> dict:
    th = th or FidelityThresholds()
    change = (pool_total - source_total) / source_total if source_total else 0.0
    check = {"value": round(change, 6), "threshold": th.token_change_max, "passed": abs(change) <= th.token_change_max,
             "source": source_total, "pool": pool_total}
    if not check["passed"]:
        check["message"] = (f"redaction.prompt_token_change: total prompt tokens changed by {100 * change:+.3f}% "
                            f"(allowed ±{100 * th.token_change_max:g}%)")
    return check


def format_report(report: dict) -> str:
    lines = [f"fidelity: {'PASSED' if report['passed'] else 'FAILED'}"]
    for name, c in report["checks"].items():
        if c.get("skipped"):
            lines.append(f"  skip {name}: {c['skipped']}")
            continue
        v = c["value"]
        lines.append(f"  {'ok  ' if c['passed'] else 'FAIL'} {name} = {v if not isinstance(v, float) else round(v, 4)}"
                     f" (threshold {c['threshold']})")
    for f in report.get("failures", []):
        lines.append(f"  -> {f}")
    return "\n".join(lines)
