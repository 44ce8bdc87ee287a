"""Owns the diagnostic report's plots (PNG files written with matplotlib's Agg backend, atomically)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)


def _save(fig: Any, path: Path) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=90, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def load_curve(steps: list[Any], sla: Any, path: Path) -> Path | None:
    steps = sorted([s for s in steps if _get(s, "kind") != "warmup"], key=lambda s: _get(s, "rate_rps"))
    if not steps:
        return None
    rates = [_get(s, "rate_rps") for s in steps]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, metric in zip(axes, ("ttft", "tpot", "itl")):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ys = [(_get(s, f"{metric}_ms") or {}).get(q) for s in steps]
            ax.plot(rates, [y if y is not None else float("nan") for y in ys], style, label=f"{metric} {q}")
        for t in getattr(sla, "terms", ()):
            if t.metric == metric:
                ax.axhline(t.max_ms, color="red", lw=1, label=f"SLA {t}")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    for s in steps:
        if not _get(s, "meets_sla"):
            for ax in axes:
                ax.axvline(_get(s, "rate_rps"), color="grey", lw=0.5, alpha=0.5)
    fig.suptitle("load curve (grey: steps that missed the SLA)")
    return _save(fig, path)


def engine_timeseries(samples: list[dict], path: Path) -> Path | None:
    if not samples:
        return None
    t = [s.get("t", i) for i, s in enumerate(samples)]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.0))
    for ax, (key, label) in zip(axes, (("sglang:num_queue_reqs", "waiting requests"),
                                       ("sglang:num_running_reqs", "running requests"),
                                       ("sglang:token_usage", "KV token usage"))):
        ax.plot(t, [s.get(key, float("nan")) for s in samples])
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("s")
    return _save(fig, path)


def profile_breakdown(summary: Any, path: Path) -> Path | None:
    share = summary.breakdown_share
    if not any(share.values()):
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.2))
    cats = list(share)
    a.barh(cats, [share[c] * 100 for c in cats])
    a.set_xlabel("% of profiled time")
    a.set_title("time by category", fontsize=9)
    bins = summary.gap_bins_us
    labels = [f"<{int(hi)}" if hi != float("inf") else f">{int(lo)}" for lo, hi in zip(bins[:-1], bins[1:])]
    b.bar(labels, summary.gap_hist)
    b.set_yscale("symlog")
    b.set_title("gaps between GPU kernels (us)", fontsize=9)
    b.tick_params(axis="x", labelsize=7, rotation=45)
    return _save(fig, path)


def hypotheses(hyps: list[Any], path: Path) -> Path | None:
    if not hyps:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.0))
    names = [h.bottleneck for h in hyps][::-1]
    ax.barh(names, [h.score for h in hyps][::-1])
    ax.set_xlim(0, 1)
    ax.set_xlabel("evidence score")
    return _save(fig, path)


def workload_lengths(prompt: list[int], output: list[int], path: Path) -> Path | None:
    if not prompt:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 2.8))
    a.hist(prompt, bins=40)
    a.set_title("prompt tokens", fontsize=9)
    b.hist(output, bins=40)
    b.set_title("output tokens", fontsize=9)
    return _save(fig, path)
