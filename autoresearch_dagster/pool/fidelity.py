"""Owns replay fidelity: the comparison of a source log's workload statistics with its pool's.

Statistics (methods.md §5, collected by ``pool.workload.WorkloadStats``): prompt/output
token-length distributions (KS distance, p50/p99/mean ratios), prefix reuse (the prefix hit rate
as ``pool.workload`` defines it: the token share an infinite prefix cache would serve), arrival
process (mean rate, CV of inter-arrival times, index of dispersion of counts at 1/10/60 s), and
concurrency (time-weighted mean and p95 of in-flight requests) when the log has timings. The
source side is collected from records as read, before redaction or synthesis changes them.
"""
from __future__ import annotations

from array import array
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import ks_2samp

from autoresearch_dagster.pool.workload import WorkloadStats


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


def summarize(ws: WorkloadStats, th: FidelityThresholds | None = None) -> dict:
    """The statistics of one side, as plain numbers."""
    th = th or FidelityThresholds()
    out: dict = {"requests": len(ws), "prefix_hit_rate": ws.prefix_hit_rate,
                 "sampled_fraction": len(ws.prompt_sample) / len(ws) if len(ws) else 1.0}
    for name, a, total in (("prompt_tokens", ws.prompt_sample, ws.prompt_sum),
                           ("output_tokens", ws.output_sample, ws.output_sum)):
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
    for name, side in (("prompt_tokens", "prompt_sample"), ("output_tokens", "output_sample")):
        checks[f"{name}.ks"] = ks_check(f"{name}.ks", getattr(source, side), getattr(pool, side), th.ks_max)
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
