"""Owns the terminal outputs (rich): the runner's one line per load step and result tables."""
from __future__ import annotations

from typing import Any, Sequence


class ConsoleProgress:
    """Prints one line per load step on the terminal: rate, achieved, p99s, errors, verdict."""

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


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Rows as a table on stdout (floats to 6 significant digits, None blank), then the row count."""
    from rich.console import Console
    from rich.table import Table

    t = Table(*columns, show_lines=False)
    for r in rows:
        t.add_row(*["" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x)) for x in r])
    Console(width=max(120, min(250, 20 * len(columns)))).print(t)
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


class Ticker:
    """Progress lines of long work on stderr, each stamped with the seconds since it started."""

    def __init__(self, stream: Any = None) -> None:
        import sys
        import time

        self._t0 = time.monotonic()
        self._time = time.monotonic
        self.stream = stream or sys.stderr

    def __call__(self, message: str) -> None:
        print(f"[{self._time() - self._t0:7.1f}s] {message}", file=self.stream, flush=True)
