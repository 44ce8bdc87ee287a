"""Owns the runner's outputs: per-request records (Parquet), the load curve (Parquet + CSV), the
latency-throughput-load plot (PNG), the JSON summary, and the terminal progress lines.

Every file is written atomically (temp file in the same directory, then ``os.replace``).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from autoresearch_dagster.loadgen.records import StepOutcome, records_to_table


def _atomic(path: Path, write: Callable[[str], None]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_records(outcomes: list[StepOutcome], path: Path) -> Path:
    """All steps' per-request records in one Parquet file (RECORD_SCHEMA; ``scheduled_s`` is the intended offset)."""
    tables = [records_to_table(o.records) for o in outcomes]
    table = pa.concat_tables(tables) if tables else records_to_table([])
    return _atomic(Path(path), lambda tmp: pq.write_table(table, tmp))


def _flat(step: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for k, v in step.items():
        if isinstance(v, dict):
            for q, x in v.items():
                row[f"{k.removesuffix('_ms')}_{q}_ms"] = x
        elif isinstance(v, list):
            row[k] = "; ".join(map(str, v))
        else:
            row[k] = v
    return row


def load_curve_table(steps: list[dict[str, Any]]) -> pa.Table:
    rows = [_flat(s) for s in steps]
    return pa.Table.from_pylist(rows) if rows else pa.table({})


def write_load_curve(steps: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    table = load_curve_table(steps)
    out_dir = Path(out_dir)
    p = _atomic(out_dir / "load_curve.parquet", lambda tmp: pq.write_table(table, tmp))
    c = _atomic(out_dir / "load_curve.csv", lambda tmp: pacsv.write_csv(table, tmp))
    return p, c


def write_summary(summary: dict[str, Any], path: Path) -> Path:
    """JSON summary; non-finite numbers become null so the file is strict JSON."""
    text = json.dumps(json_finite(summary), indent=2, default=str)
    return _atomic(Path(path), lambda tmp: Path(tmp).write_text(text + "\n"))


def json_finite(o: Any) -> Any:
    """The JSON tree with NaN/inf replaced by null, so the file stays strict JSON."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: json_finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_finite(v) for v in o]
    return o


def plot_load_curve(steps: list[dict[str, Any]], path: Path, *, capacity: float | None, sla: str = "",
                    x_label: str = "offered rate (req/s)", title: str = "Latency-throughput-load curve") -> Path:
    """TTFT and TPOT p50/p95/p99 and achieved throughput against the offered rate, capacity marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xkey = "rate_rps" if x_label == "speed-up" else "offered_rps"
    pts = sorted((s for s in steps if s.get("kind") != "warmup"), key=lambda s: s[xkey])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    xs = [s[xkey] for s in pts]
    for ax, metric, name in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")):
        for q, style in (("p50", "-o"), ("p95", "--s"), ("p99", ":^")):
            ys = [s[metric][q] if s[metric][q] is not None else math.nan for s in pts]
            ax.plot(xs, ys, style, label=q, markersize=4)
        ax.set_ylabel(name)
    axes[2].plot(xs, [s["achieved_rps"] for s in pts], "-o", label="achieved (completed)", markersize=4)
    axes[2].plot(xs, [s["goodput_rps"] for s in pts], "--s", label="goodput (met SLA)", markersize=4)
    if xkey == "offered_rps":
        axes[2].plot(xs, xs, ":", color="grey", label="offered")
    axes[2].set_ylabel("requests/s")
    for ax in axes:
        ax.set_xlabel(x_label)
        for s in pts:
            if not s.get("passed", False):
                ax.axvspan(s[xkey] * 0.995, s[xkey] * 1.005, color="red", alpha=0.15)
        if capacity:
            ax.axvline(capacity, color="green", linestyle="--", label=f"capacity {capacity:.3g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}  (SLA: {sla}; red bands: steps that failed the SLA or were invalid)", fontsize=10)
    fig.tight_layout()

    def save(tmp: str) -> None:
        fig.savefig(tmp, format="png", dpi=100)
    try:
        return _atomic(Path(path), save)
    finally:
        plt.close(fig)


class ConsoleProgress:
    """Prints one line per load step on the terminal (rich): rate, achieved, p99s, errors, verdict."""

    def __init__(self, console: Any | None = None, *, unit: str = "rps") -> None:
        from rich.console import Console
        self.console = console or Console(stderr=True)
        self.unit = unit

    def step_started(self, step_id: str, n: int, span_s: float) -> None:
        self.console.print(f"[dim]> {step_id}: sending {n} requests over {span_s:.1f} s ...[/]")

    def __call__(self, step: Any) -> None:
        p99 = lambda d: f"{d['p99']:.0f}" if d.get("p99") is not None else "-"  # noqa: E731
        verdict = ("[green]pass[/]" if step.passed else "[red]fail[/]") if step.valid else "[yellow]invalid[/]"
        rate = f"x{step.rate_rps:.3g}" if self.unit == "speedup" else f"{step.rate_rps:.3g} req/s"
        self.console.print(
            f"[bold]{step.step_id}[/] {step.kind:8s} {rate:>12s}  offered {step.offered_rps:7.2f}  "
            f"achieved {step.achieved_rps:7.2f}  ttft p99 {p99(step.ttft_ms)} ms  tpot p99 {p99(step.tpot_ms)} ms  "
            f"itl p99 {p99(step.itl_ms)} ms  errors {step.error_rate * 100:.1f}%  n={step.n_sent}  {verdict}"
            + (f"  [dim]{'; '.join(step.failed_terms + step.invalid_reasons)}[/]" if step.failed_terms or step.invalid_reasons else ""))


def write_intervals(intervals: list[dict[str, Any]], out_dir: Path) -> Path:
    """Per-interval SLA attainment of a production-shape replay (CSV)."""
    table = pa.Table.from_pylist(intervals) if intervals else pa.table({})
    return _atomic(Path(out_dir) / "intervals.csv", lambda tmp: pacsv.write_csv(table, tmp))


def plot_intervals(intervals: list[dict[str, Any]], path: Path, *, sla: str, speedup: float | None) -> Path:
    """Target rate and SLA attainment per interval over the replay."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4))
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
    fig.tight_layout()
    try:
        return _atomic(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(fig)
