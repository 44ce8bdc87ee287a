"""Owns the PNG plots attached to asset metadata: load curves with the capacity marker and noise band."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

from autoresearch_dagster.spec import SLA  # noqa: E402

_UNITS = {"ttft": "ttft_ms", "itl": "itl_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}


def _quantile(step: dict[str, Any], metric: str, q: float) -> float | None:
    values = step.get(_UNITS[metric]) or {}
    key = f"p{int(q) if float(q).is_integer() else q}"
    v = values.get(key)
    return float(v) if isinstance(v, (int, float)) else None


def load_curves_png(runs: list[dict[str, Any]], sla: SLA, out: Path, *, title: str,
                    band: tuple[float, float] | None = None) -> Path:
    """Each SLA term's quantile divided by its bound, against offered rate, for every run.

    A curve crossing 1.0 breaks the SLA; vertical lines mark each run's capacity, the shaded band
    is the noise floor (CI of the median capacity) when given."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=90)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for t_i, term in enumerate(sla.terms):
        for r_i, run in enumerate(runs):
            steps = sorted((s for s in run.get("steps", []) if s.get("kind", "capacity") != "warmup"),
                           key=lambda s: s.get("rate_rps", 0.0))
            pts = [(s["rate_rps"], v / term.max_ms) for s in steps
                   if (v := _quantile(s, term.metric, term.quantile)) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", ms=3, lw=1, alpha=0.8 if r_i == 0 else 0.35,
                        color=colors[t_i % len(colors)], label=str(term) if r_i == 0 else None)
    for run in runs:
        if run.get("capacity_rps"):
            ax.axvline(run["capacity_rps"], color="black", lw=0.8, alpha=0.5)
    if band:
        ax.axvspan(band[0], band[1], color="grey", alpha=0.2, label="noise band (CI of median capacity)")
    ax.axhline(1.0, color="red", ls="--", lw=1, label="SLA bound")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("quantile / SLA bound")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, out)


def ratio_png(verdicts: list[dict[str, Any]], out: Path, *, title: str) -> Path:
    """Median capacity ratio with its CI per candidate, with the ±margin band around 1."""
    fig, ax = plt.subplots(figsize=(7, 0.6 * max(len(verdicts), 1) + 1.5), dpi=90)
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
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    """Write the figure atomically (temp file + rename) and close it."""
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(out)
    return out
