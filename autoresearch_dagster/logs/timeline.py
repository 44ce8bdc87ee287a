"""Owns the timeline limits of a log: timestamp outliers, and the longest gap and span a pool may have.

A mistyped timestamp (a year 2099, ``1e300``) must neither stretch a pool's timeline to decades
(the production-shape replay counts requests per interval over the whole span) nor upset the
reorder window (a record far in the future stays the newest one, so every later record looks late).
``TimelineGate`` sits between the readers and the reorder window, sees records in file order, and
quarantines, with a reason naming the value and the limit:

- outliers: a record more than ``max_gap_s`` after the latest, or before the earliest, record
  accepted so far (the timeline so far);
- a record that would make the timeline span more than ``max_span_s``.

The timeline so far starts robustly: the first ``probe_records`` records are held (a bounded
lookahead; nothing is read twice), their median found, and the timeline starts as the run of them
around the median with no gap over ``max_gap_s``, so an outlier among the first records, even the
very first one, is not taken for the start. After that each record costs O(1) (chunks of trace rows
one vectorized pass). Limits of the rule: a real pause longer than ``max_gap_s`` ends the timeline
(what follows is quarantined with that reason: raise the limit or split the log), and of two parts
of a log further apart than that, the one holding the first records' median is kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import numpy as np

from autoresearch_dagster.logs.records import Rejected
from autoresearch_dagster.spec import SpecError

DAY_S = 86400.0


@dataclass(frozen=True)
class TimelineLimits:
    """How far apart a pool's records may be (seconds) and how many first records find the median."""
    max_span_s: float = 31 * DAY_S  # a month of traffic; longer logs: raise it or build one pool per month
    max_gap_s: float = 7 * DAY_S  # a week: weekends and holidays of business-hours traffic stay in
    probe_records: int = 1001

    def __post_init__(self) -> None:
        for name in ("max_span_s", "max_gap_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v == v and 0 < v < float("inf")):
                raise SpecError(f"timeline limit {name} must be a positive number of seconds, got {v!r}")
        if self.max_gap_s > self.max_span_s:
            raise SpecError(f"the largest gap ({duration(self.max_gap_s)}) cannot exceed the longest span "
                            f"({duration(self.max_span_s)})")
        if self.probe_records < 1:
            raise SpecError(f"probe_records must be at least 1, got {self.probe_records}")


def duration(seconds: float) -> str:
    s = abs(seconds)
    if s >= DAY_S:
        days = s / DAY_S
        return f"{days:.0f} days" if 1e4 <= days < 1e9 else f"{days:.4g} days"
    if s >= 3600:
        return f"{s / 3600:.4g} h"
    return f"{s:.4g} s"


def moment(ts: float) -> str:
    """A timestamp as read, with its UTC date when it looks like an epoch time."""
    text = f"{ts:.15g}"
    if 1e8 <= ts < 253402300800:  # 1973 .. 9999: an epoch time (trace-relative times are smaller)
        text += datetime.fromtimestamp(ts, timezone.utc).strftime(" (%Y-%m-%d %H:%M:%S UTC)")
    return text


class TimelineGate:
    """Admits records whose timestamps keep the timeline within ``TimelineLimits``, in file order.

    ``push_one`` takes one record, ``push_many`` a batch of rows (a trace chunk) as an array of
    timestamps; ``emit(item, keep)`` receives each item once decided, in the order pushed, with
    ``keep`` None (all of it admitted) or a boolean mask of its admitted rows; ``reject`` receives
    a ``Rejected`` per refused row. Items are held until the first ``probe_records`` rows are in
    (or ``finish``).
    """

    def __init__(self, limits: TimelineLimits | None, emit: Callable[[object, np.ndarray | None], None],
                 reject: Callable[[Rejected], None]):
        self.limits = limits or TimelineLimits()
        self.emit, self.reject = emit, reject
        self.floor: float | None = None  # earliest admitted timestamp (None until the probe is decided)
        self.frontier: float | None = None  # latest admitted timestamp
        self._held: list[tuple[np.ndarray, np.ndarray, np.ndarray, object, bool]] = []
        self._held_rows = 0

    # ---------------------------------------------------------------- pushing

    def push_one(self, ts: float, line: int, nbytes: int, item: object) -> None:
        if self.floor is None:
            self._hold(np.array([ts], np.float64), np.array([line]), np.array([nbytes]), item, True)
            return
        reason = self._decide(ts)
        if reason is None:
            self.emit(item, None)
        else:
            self.reject(Rejected(line, reason, nbytes))

    def push_many(self, ts: np.ndarray, lines: np.ndarray, nbytes: np.ndarray, item: object) -> None:
        if not len(ts):
            return
        if self.floor is None:
            self._hold(ts, lines, nbytes, item, False)
            return
        self._decide_many(ts, lines, nbytes, item)

    def finish(self) -> None:
        if self.floor is None and self._held:
            self._start()

    # ---------------------------------------------------------------- the probe

    def _hold(self, ts, lines, nbytes, item, single: bool) -> None:
        self._held.append((np.asarray(ts, np.float64), lines, nbytes, item, single))
        self._held_rows += len(ts)
        if self._held_rows >= self.limits.probe_records:
            self._start()

    def _start(self) -> None:
        """Start the timeline at the held rows' run around their median, then decide the held items."""
        gap, span = self.limits.max_gap_s, self.limits.max_span_s
        # exactly the first probe_records rows, however they were batched (a batch may run past them)
        ts = np.sort(np.concatenate([h[0] for h in self._held])[:self.limits.probe_records])
        mid = (len(ts) - 1) // 2  # the lower median: a timestamp that was read
        breaks = np.flatnonzero(np.diff(ts) > gap)  # i: a gap between ts[i] and ts[i + 1]
        lo = ts[breaks[breaks < mid].max() + 1] if (breaks < mid).any() else ts[0]
        hi = ts[breaks[breaks >= mid].min()] if (breaks >= mid).any() else ts[-1]
        self.floor, self.frontier = float(lo), float(min(hi, lo + span))
        held, self._held, self._held_rows = self._held, [], 0
        for t, lines, nbytes, item, single in held:
            if single:
                self.push_one(float(t[0]), int(lines[0]), int(nbytes[0]), item)
            else:
                self._decide_many(t, lines, nbytes, item)

    # ---------------------------------------------------------------- the rule

    def _decide(self, ts: float) -> str | None:
        """None and the timeline extended to ``ts``, or the reason it is refused."""
        gap, span = self.limits.max_gap_s, self.limits.max_span_s
        lo, hi = self.floor, self.frontier
        if ts > hi + gap:
            return (f"timestamp outlier: {moment(ts)} is {duration(ts - hi)} after the timeline so far "
                    f"(up to {moment(hi)}); the largest gap allowed is {duration(gap)}")
        if ts < lo - gap:
            return (f"timestamp outlier: {moment(ts)} is {duration(lo - ts)} before the timeline so far "
                    f"(from {moment(lo)}); the largest gap allowed is {duration(gap)}")
        new_lo, new_hi = min(lo, ts), max(hi, ts)
        if new_hi - new_lo > span:
            return (f"timestamp beyond the span limit: {moment(ts)} would make the timeline span "
                    f"{duration(new_hi - new_lo)} (from {moment(new_lo)} to {moment(new_hi)}); the longest span "
                    f"allowed is {duration(span)}")
        self.floor, self.frontier = new_lo, new_hi
        return None

    def _decide_many(self, ts: np.ndarray, lines: np.ndarray, nbytes: np.ndarray, item: object) -> None:
        gap = self.limits.max_gap_s
        run_hi = np.maximum.accumulate(np.concatenate([[self.frontier], ts]))[:-1]
        run_lo = np.minimum.accumulate(np.concatenate([[self.floor], ts]))[:-1]
        lo, hi = min(self.floor, float(ts.min())), max(self.frontier, float(ts.max()))
        if bool(((ts <= run_hi + gap) & (ts >= run_lo - gap)).all()) and hi - lo <= self.limits.max_span_s:
            self.floor, self.frontier = lo, hi  # every row passes: the per-row rule gives the same
            self.emit(item, None)
            return
        keep = np.ones(len(ts), bool)
        for i, t in enumerate(ts.tolist()):
            reason = self._decide(t)
            if reason is not None:
                keep[i] = False
                self.reject(Rejected(int(lines[i]), reason, int(nbytes[i])))
        if keep.all():
            self.emit(item, None)
        elif keep.any():
            self.emit(item, keep)


__all__ = ["DAY_S", "TimelineGate", "TimelineLimits", "duration", "moment"]
