"""Owns the diagnosis-specific plots: engine time series, profile breakdown, hypothesis scores, prompt and
output lengths (the load curve is ``outputs.plots``'s). Each returns None when there is nothing to draw."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from autoresearch_dagster.outputs.plots import save_png


def engine_timeseries(samples: list[dict], path: Path) -> Path | None:
    if not samples:
        return None
    t = [s.get("t", i) for i, s in enumerate(samples)]
    fig = Figure(figsize=(12, 3.0), layout="constrained")
    for ax, (key, label) in zip(fig.subplots(1, 3), (("sglang:num_queue_reqs", "waiting requests"),
                                                     ("sglang:num_running_reqs", "running requests"),
                                                     ("sglang:token_usage", "KV token usage"))):
        ax.plot(t, [s.get(key, float("nan")) for s in samples])
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("s")
    return save_png(fig, path)


def profile_breakdown(summary: Any, path: Path) -> Path | None:
    share = summary.breakdown_share
    if not any(share.values()):
        return None
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    a, b = fig.subplots(1, 2)
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
    return save_png(fig, path)


def hypotheses(hyps: list[Any], path: Path) -> Path | None:
    if not hyps:
        return None
    fig = Figure(figsize=(7, 3.0), layout="constrained")
    ax = fig.subplots()
    names = [h.bottleneck for h in hyps][::-1]
    ax.barh(names, [h.score for h in hyps][::-1])
    ax.set_xlim(0, 1)
    ax.set_xlabel("evidence score")
    return save_png(fig, path)


def workload_lengths(prompt: list[int], output: list[int], path: Path) -> Path | None:
    if not prompt:
        return None
    fig = Figure(figsize=(10, 2.8), layout="constrained")
    a, b = fig.subplots(1, 2)
    a.hist(prompt, bins=40)
    a.set_title("prompt tokens", fontsize=9)
    b.hist(output, bins=40)
    b.set_title("output tokens", fontsize=9)
    return save_png(fig, path)
