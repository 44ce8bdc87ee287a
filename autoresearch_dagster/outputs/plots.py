"""Owns the plots (PNG, matplotlib's Agg renderer): the one load-curve plot with its capacity marker and
noise band, the production-shape replay's intervals and autoscaling (replicas vs demand), the candidates'
capacity ratios, and the atomic save every plot goes through.

Figures are ``matplotlib.figure.Figure`` objects, never pyplot's: no global backend to switch and no
figure registry shared between the threads Dagster runs assets in.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from matplotlib.figure import Figure

from autoresearch_dagster.outputs.files import atomic_write
from autoresearch_dagster.spec import SLA

# a run's load steps (step dicts or LoadStep objects, warm-up steps included) and its capacity (None: none)
Run = tuple[Sequence[Any], float | None]

_QUANTILES = (("p50", "-o", "C0"), ("p95", "--s", "C1"), ("p99", ":^", "C2"))
_LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
_OTHER_RUNS_ALPHA = 0.35  # runs after the first are drawn faintly, so repeats show spread, not clutter


def save_png(fig: Figure, path: str | Path, *, dpi: int = 100) -> Path:
    """Write the figure to ``path`` as a PNG, atomically."""
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))


def _field(step: Any, name: str) -> Any:
    return step.get(name) if isinstance(step, dict) else getattr(step, name, None)


def _ms(step: Any, metric: str, q: str) -> float:
    v = (_field(step, f"{metric}_ms") or {}).get(q)
    return float(v) if v is not None else math.nan


def load_curve_figure(runs: Sequence[Run], *, sla: SLA | None = None, band: tuple[Any, Any] | None = None,
                      speedup: bool = False, title: str = "Latency-throughput-load curve") -> Figure:
    """Latency quantiles p50/p95/p99 (one log-scale panel each for TTFT, TPOT and any other metric the SLA
    bounds, the bounds as red lines) and throughput (achieved, goodput, offered) against the offered rate, or
    the speed-up of a production-shape replay, for one or more runs of a config. Each run's capacity is a
    green dashed line; ``band`` (the CI of the median capacity) is shaded grey; thin red bands mark steps
    that failed the SLA or were invalid."""
    terms = list(sla.terms) if sla is not None else []
    metrics = list(dict.fromkeys(["ttft", "tpot"] + [t.metric for t in terms]))
    fig = Figure(figsize=(5 * (len(metrics) + 1), 4.5), layout="constrained")
    axes = fig.subplots(1, len(metrics) + 1, squeeze=False)[0]
    lat_axes, tp_ax = axes[:-1], axes[-1]
    xkey_all: list[float] = []
    for i, (steps, capacity) in enumerate(runs):
        first = i == 0
        alpha = 1.0 if first else _OTHER_RUNS_ALPHA
        pts = sorted((s for s in steps if _field(s, "kind") != "warmup"), key=lambda s: _field(s, "rate_rps"))
        xs = [_field(s, "rate_rps") for s in pts]
        xkey_all += xs
        for ax, metric in zip(lat_axes, metrics):
            for q, style, color in _QUANTILES:
                ax.plot(xs, [_ms(s, metric, q) for s in pts], style, color=color, alpha=alpha, markersize=4,
                        label=q if first else None)
        tp_ax.plot(xs, [_field(s, "achieved_rps") for s in pts], "-o", color="C0", alpha=alpha, markersize=4,
                   label="achieved (completed)" if first else None)
        tp_ax.plot(xs, [_field(s, "goodput_rps") for s in pts], "--s", color="C1", alpha=alpha, markersize=4,
                   label="goodput (met SLA)" if first else None)
        for s in pts:
            if not _field(s, "passed"):
                for ax in axes:
                    ax.axvspan(_field(s, "rate_rps") * 0.995, _field(s, "rate_rps") * 1.005, color="red", alpha=0.15)
        if capacity:
            label = (f"capacity {capacity:.3g}" if len(runs) == 1 else "capacity (each run)") if first else None
            for ax in axes:
                ax.axvline(capacity, color="green", linestyle="--", alpha=alpha, label=label)
    if not speedup and xkey_all:
        lo, hi = min(xkey_all), max(xkey_all)
        tp_ax.plot([lo, hi], [lo, hi], ":", color="grey", label="offered")
    if band is not None and all(isinstance(b, (int, float)) for b in band):
        for ax in axes:
            ax.axvspan(band[0], band[1], color="grey", alpha=0.2, label="noise band (CI of median capacity)")
    for ax, metric in zip(lat_axes, metrics):
        for t in terms:
            if t.metric == metric:
                ax.axhline(t.max_ms, color="red", lw=1, label=f"SLA {t}")
        ax.set_ylabel(f"{_LATENCY_NAMES.get(metric, metric)} (ms)")
        ax.set_yscale("log")
    tp_ax.set_ylabel("requests/s")
    for ax in axes:
        ax.set_xlabel("speed-up" if speedup else "offered rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}  (SLA: {sla if sla is not None else 'none'}; red bands: steps that failed the SLA "
                 "or were invalid)", fontsize=10)
    return fig


def plot_load_curve(runs: Sequence[Run], path: str | Path, *, sla: SLA | None = None,
                    band: tuple[Any, Any] | None = None, speedup: bool = False,
                    title: str = "Latency-throughput-load curve") -> Path:
    """``load_curve_figure`` saved as a PNG at ``path``."""
    return save_png(load_curve_figure(runs, sla=sla, band=band, speedup=speedup, title=title), path)


def plot_intervals(intervals: list[dict[str, Any]], path: str | Path, *, sla: SLA | str,
                   speedup: float | None) -> Path:
    """Target rate and SLA attainment per interval over a production-shape replay."""
    fig = Figure(figsize=(12, 4), layout="constrained")
    ax = fig.subplots()
    xs = [i["start_s"] for i in intervals]
    ax.step(xs, [i["target_rps"] for i in intervals], where="post", label="target rate (req/s)")
    ax.set_xlabel("replay time (s)")
    ax.set_ylabel("req/s")
    ax2 = ax.twinx()
    ax2.plot(xs, [i["attainment"] if i["attainment"] is not None else math.nan for i in intervals], "o-",
             color="tab:green", markersize=3, label="SLA attainment")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("fraction meeting every SLA term")
    for i in intervals:
        if i["meets_sla"] is False:
            ax.axvspan(i["start_s"], i["start_s"] + (xs[1] - xs[0] if len(xs) > 1 else 1), color="red", alpha=0.12)
    ax.set_title(f"Production-shape replay at x{speedup:.3g}  (SLA: {sla}; red: intervals failing it)", fontsize=10)
    fig.legend(loc="lower left", fontsize=8)
    return save_png(fig, path)


def plot_autoscaling(runs: Sequence[tuple[str, dict[str, Any]]], intervals: list[dict[str, Any]],
                     path: str | Path) -> Path:
    """Replicas held (and serving, and the autoscaler's wish) against the demand over a production-shape replay,
    one labelled autoscaling report per config, burst windows of the first shaded."""
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax = fig.subplots()
    xs = [i["start_s"] for i in intervals]
    ax.step(xs + [xs[-1] + (xs[1] - xs[0] if len(xs) > 1 else 1)] if xs else [],
            [i["target_rps"] for i in intervals] + ([intervals[-1]["target_rps"]] if intervals else []),
            where="post", color="grey", lw=2, label="demand (req/s)")
    ax.set_xlabel("replay time (s)")
    ax.set_ylabel("req/s")
    ax2 = ax.twinx()
    for k, (label, rep) in enumerate(runs):
        series, color = rep["series"], f"C{k}"
        ax2.step(series["t_s"], series["replicas"], where="post", color=color, lw=1.6,
                 label=f"{label}: replicas held ({rep['gpu_seconds']:.0f} GPU-s)")
        if series.get("replicas_ready"):
            ax2.step(series["t_s"], series["replicas_ready"], where="post", color=color, ls="--", lw=1,
                     label=f"{label}: serving")
        if series.get("desired_replicas"):
            ax2.step(series["t_s"], series["desired_replicas"], where="post", color=color, ls=":", lw=1,
                     label=f"{label}: desired")
    if runs:
        for lo, hi in runs[0][1]["burst_windows"]:
            ax.axvspan(lo, hi, color="red", alpha=0.12)
    ax2.set_ylabel("replicas")
    ax2.set_ylim(bottom=0)
    ax.set_title("Autoscaling under the production shape (red: demand above the serving capacity)", fontsize=10)
    fig.legend(loc="upper right", fontsize=7)
    return save_png(fig, path)


def plot_ratios(verdicts: list[dict[str, Any]], path: str | Path, *, title: str) -> Path:
    """Median capacity ratio with its CI per candidate, with the ±margin band around 1."""
    fig = Figure(figsize=(7, 0.6 * max(len(verdicts), 1) + 1.5), layout="constrained")
    ax = fig.subplots()
    for i, v in enumerate(verdicts):
        r, lo, hi = v.get("ratio_median"), v.get("ci_low"), v.get("ci_high")
        if r is None:  # no comparison (invalid run, failed gate): say why instead of leaving a blank row
            reasons = v.get("invalid_reasons") or []
            why = (reasons[0] if reasons else "no ratio").split(";")[0][:70]
            ax.plot([1.0], [i], "x", color="tab:red", ms=9)
            ax.annotate(f"{v.get('verdict', '?')}: {why}", (1.0, i), textcoords="offset points",
                        xytext=(8, -3), fontsize=8, color="tab:red")
            continue
        ax.errorbar([r], [i], xerr=[[r - (lo if lo is not None else r)], [(hi if hi is not None else r) - r]],
                    fmt="o", capsize=4)
        ax.annotate(v.get("verdict", "?"), (r, i), textcoords="offset points", xytext=(6, 6), fontsize=8)
    margin = max((v.get("margin") or 0.0) for v in verdicts) if verdicts else 0.0
    ax.axvspan(1 - margin, 1 + margin, color="grey", alpha=0.2, label=f"±margin ({margin:.1%})")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(verdicts)), [v.get("candidate_id", "?") for v in verdicts])
    ax.set_xlabel("candidate / baseline median capacity")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return save_png(fig, path)
