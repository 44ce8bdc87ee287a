"""Owns replay fidelity: workload statistics of a source log and of a pool, and their comparison.

Statistics (methods.md §5): prompt/output token-length distributions (KS distance, p50/p99/mean
ratios), prefix reuse (hit rate of an infinite prefix cache over chained block hashes), arrival
process (mean rate, CV of inter-arrival times, index of dispersion of counts at 1/10/60 s), and
concurrency (time-weighted mean and p95 of in-flight requests) when the log has timings. The
source side is collected from records as read, before redaction or synthesis changes them.
"""
from __future__ import annotations

import heapq
from array import array
from dataclasses import asdict, dataclass
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


_MASK64 = 2**64 - 1


def mix64(x: int) -> int:
    """splitmix64: a uniform 64-bit hash of an integer (scalar twin of ``mix64_np``)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def mix64_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.asarray(x).astype(np.int64).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class PrefixCache:
    """Hit rate of an infinite prefix cache over chained block hashes, in bounded memory.

    With an infinite cache every distinct hash misses once and hits on every later occurrence, so
    hit rate = 1 - distinct / total. ``total`` is exact; ``distinct`` is exact until ``max_tracked``
    distinct hashes, then estimated from the hashes whose mixed value falls in a shrinking sample
    (adaptive hash sampling: relative error about 1/sqrt(max_tracked)).
    """

    def __init__(self, max_tracked: int = 2_000_000) -> None:
        self._seen: set[int] = set()
        self.total = 0
        self.level = 0  # tracked hashes: mix(h) % 2**level == 0
        self.max_tracked = max_tracked

    def _shrink(self) -> None:
        while len(self._seen) > self.max_tracked:
            self.level += 1
            mask = (1 << self.level) - 1
            self._seen = {h for h in self._seen if mix64(h) & mask == 0}

    def add(self, hashes: Iterable[int]) -> None:
        if self.level == 0:
            n0 = len(hashes) if isinstance(hashes, (list, tuple)) else None
            if n0 is None:
                hashes = list(hashes)
                n0 = len(hashes)
            self.total += n0
            self._seen.update(hashes)
        else:
            mask = (1 << self.level) - 1
            for h in hashes:
                self.total += 1
                if mix64(h) & mask == 0:
                    self._seen.add(h)
        if len(self._seen) > self.max_tracked:
            self._shrink()

    def add_flat(self, hashes: np.ndarray, unique: np.ndarray | None = None) -> None:
        """The hashes of many requests at once (``unique``: np.unique of them, if already known)."""
        if not len(hashes):
            return
        self.total += len(hashes)
        u = np.unique(hashes) if unique is None else unique
        if self.level:
            u = u[(mix64_np(u) & np.uint64((1 << self.level) - 1)) == 0]
        self._seen.update(u.tolist())
        if len(self._seen) > self.max_tracked:
            self._shrink()

    @property
    def distinct(self) -> float:
        return len(self._seen) * float(1 << self.level)

    @property
    def hit_rate(self) -> float:
        return max(0.0, 1.0 - self.distinct / self.total) if self.total else 0.0


class _Arrivals:
    """Streaming arrival statistics of in-order arrivals: count, span, inter-arrival moments, window counts."""

    MAX_BINS = 10_000_000

    def __init__(self, windows: tuple[float, ...]) -> None:
        self.n = 0
        self.first = self.last = 0.0
        self.gap_sum = self.gap_sq = 0.0
        self.windows = windows
        self.bins: dict[float, array | None] = {w: array("q") for w in windows}

    def _counts(self, w: float, top: int) -> array | None:
        counts = self.bins[w]
        if counts is not None and top > len(counts):
            if top > self.MAX_BINS:
                self.bins[w] = None  # span too long for windows this small
                return None
            counts.frombytes(bytes(8 * max(top - len(counts), len(counts))))
        return counts

    def add_one(self, t: float) -> None:
        if self.n == 0:
            self.first = self.last = t
        t = max(t, self.last)  # arrivals come in order; guard against disorder
        gap = t - self.last
        self.gap_sum += gap
        self.gap_sq += gap * gap
        self.n += 1
        self.last = t
        for w in self.windows:
            i = int((t - self.first) // w)
            counts = self._counts(w, i + 1)
            if counts is not None:
                counts[i] += 1

    def add(self, t: np.ndarray) -> None:
        if not len(t):
            return
        if self.n == 0:
            self.first = self.last = float(t[0])
        t = np.maximum.accumulate(np.maximum(np.asarray(t, np.float64), self.last))
        gaps = np.diff(np.concatenate([[self.last], t]))
        self.gap_sum += float(gaps.sum())
        self.gap_sq += float((gaps * gaps).sum())
        self.n += len(t)
        self.last = float(t[-1])
        for w in self.windows:
            idx = ((t - self.first) // w).astype(np.int64)
            counts = self._counts(w, int(idx[-1]) + 1)
            if counts is not None:
                lo = int(idx[0])
                view = np.frombuffer(counts, np.int64)
                view[lo:int(idx[-1]) + 1] += np.bincount(idx - lo)

    def summary(self, min_windows: int) -> dict | None:
        if self.n < 2 or self.last <= self.first:
            return None
        gaps_n = self.n - 1
        mean = self.gap_sum / gaps_n
        var = max(0.0, self.gap_sq / gaps_n - mean * mean)
        out = {"duration_s": self.last - self.first, "rate_rps": gaps_n / (self.last - self.first),
               "cv": (var ** 0.5) / mean if mean > 0 else None}
        for w in self.windows:
            k = int((self.last - self.first) // w)
            counts = self.bins[w]
            if counts is None or k < min_windows:
                out[f"idc_{w:g}s"] = None
                continue
            c = np.frombuffer(counts, np.int64)[:k]
            if len(c) < k:
                c = np.concatenate([c, np.zeros(k - len(c), np.int64)])
            m = c.mean()
            out[f"idc_{w:g}s"] = float(c.var() / m) if m > 0 else None
        return out


class _Concurrency:
    """Time-weighted in-flight requests from (arrival, latency) in arrival order: a streaming sweep.

    Memory is the current number in flight plus a histogram over concurrency levels.
    """

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.level = 0
        self.t = None
        self.hist: dict[int, float] = {}
        self.with_latency = 0

    def _advance(self, to: float) -> None:
        if self.t is not None and to > self.t:
            self.hist[self.level] = self.hist.get(self.level, 0.0) + (to - self.t)
        self.t = to if self.t is None else max(self.t, to)

    def add(self, start: float, latency: float) -> None:
        self.with_latency += 1
        while self.ends and self.ends[0] <= start:  # ends before starts at equal times
            self._advance(heapq.heappop(self.ends))
            self.level -= 1
        self._advance(start)
        self.level += 1
        heapq.heappush(self.ends, start + latency)

    def summary(self, n_requests: int) -> dict | None:
        if self.with_latency < max(2, 0.5 * n_requests):
            return None
        while self.ends:
            self._advance(heapq.heappop(self.ends))
            self.level -= 1
        total = sum(self.hist.values())
        if total <= 0:
            return None
        mean = sum(level * d for level, d in self.hist.items()) / total
        acc = 0.0
        for level in sorted(self.hist):
            acc += self.hist[level] / total
            if acc >= 0.95:
                return {"mean": mean, "p95": float(level)}
        return {"mean": mean, "p95": float(max(self.hist))}


class WorkloadStats:
    """One side of the comparison, collected incrementally in bounded memory.

    Arrival, concurrency and prefix statistics are streaming; token lengths keep exact sums and a
    sample of up to ``max_samples`` requests chosen by a hash of each request's position (all of
    them until then), so two sides fed the same requests in the same order sample the same ones.
    Requests must be added in arrival order.
    """

    def __init__(self, max_samples: int = 200_000, windows: tuple[float, ...] = (1.0, 10.0, 60.0)) -> None:
        self.n = 0
        self.prompt_tokens = array("q")  # sampled
        self.output_tokens = array("q")
        self._keys = array("q")
        self.prompt_sum = self.output_sum = 0
        self.level = 0
        self.max_samples = max_samples
        self.arrivals = _Arrivals(windows)
        self.concurrency = _Concurrency()
        self.cache = PrefixCache()

    def _resample(self) -> None:
        while len(self._keys) > self.max_samples:
            self.level += 1
            keep = (mix64_np(np.frombuffer(self._keys, np.int64)) & np.uint64((1 << self.level) - 1)) == 0
            for name in ("_keys", "prompt_tokens", "output_tokens"):
                setattr(self, name, array("q", np.frombuffer(getattr(self, name), np.int64)[keep].tobytes()))

    def add(self, arrival_s: float, prompt_tokens: int, output_tokens: int, hashes: Iterable[int] = (),
            latency_s: float | None = None) -> None:
        key = self.n
        self.n += 1
        self.prompt_sum += prompt_tokens
        self.output_sum += output_tokens
        if self.level == 0 or mix64(key) & ((1 << self.level) - 1) == 0:
            self._keys.append(key)
            self.prompt_tokens.append(prompt_tokens)
            self.output_tokens.append(output_tokens)
            if len(self._keys) > self.max_samples:
                self._resample()
        self.arrivals.add_one(float(arrival_s))
        if latency_s is not None:
            self.concurrency.add(arrival_s, latency_s)
        self.cache.add(hashes)

    def add_many(self, arrivals: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 hashes: np.ndarray | None = None, unique: np.ndarray | None = None) -> None:
        n = len(arrivals)
        keys = np.arange(self.n, self.n + n, dtype=np.int64)
        self.n += n
        self.prompt_sum += int(np.sum(prompt_tokens))
        self.output_sum += int(np.sum(output_tokens))
        keep = slice(None) if self.level == 0 else \
            (mix64_np(keys) & np.uint64((1 << self.level) - 1)) == 0
        self._keys.frombytes(keys[keep].tobytes())
        self.prompt_tokens.frombytes(np.ascontiguousarray(prompt_tokens, np.int64)[keep].tobytes())
        self.output_tokens.frombytes(np.ascontiguousarray(output_tokens, np.int64)[keep].tobytes())
        if len(self._keys) > self.max_samples:
            self._resample()
        self.arrivals.add(np.asarray(arrivals, np.float64))
        if hashes is not None:
            self.cache.add_flat(hashes, unique)

    def __len__(self) -> int:
        return self.n


def summarize(ws: WorkloadStats, th: FidelityThresholds | None = None) -> dict:
    """The statistics of one side, as plain numbers."""
    th = th or FidelityThresholds()
    out: dict = {"requests": len(ws), "prefix_hit_rate": ws.cache.hit_rate,
                 "sampled_fraction": len(ws.prompt_tokens) / len(ws) if len(ws) else 1.0}
    for name, a, total in (("prompt_tokens", ws.prompt_tokens, ws.prompt_sum),
                           ("output_tokens", ws.output_tokens, ws.output_sum)):
        x = np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0)
        out[name] = ({"mean": total / len(ws), "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99))}
                     if len(x) else None)
    arrival = ws.arrivals.summary(th.min_windows)
    if arrival is not None:
        out["arrival"] = arrival
    out["concurrency"] = ws.concurrency.summary(len(ws))
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


def format_brief(report: dict) -> str:
    """One line (plus one per failure): the verdict and how many checks passed, failed or were skipped."""
    checks = report["checks"].values()
    skipped = sum(1 for c in checks if c.get("skipped"))
    failed = sum(1 for c in checks if not c["passed"])
    line = (f"fidelity: {'PASSED' if report['passed'] else 'FAILED'} ({len(report['checks']) - skipped - failed} passed, "
            f"{failed} failed, {skipped} skipped)")
    return "\n".join([line] + [f"  -> {f}" for f in report.get("failures", [])])


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
