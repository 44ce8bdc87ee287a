"""Owns the scoring of predictions against outcomes: direction hits and interval coverage.

Each tested proposal's prediction is compared with its experiment: the predicted direction (up when
the predicted ratio clears 1 + the verdict margin, down below 1 - margin, flat between) against the
verdict (better, worse, same), and whether the measured median ratio fell inside the predicted
interval. Invalid experiments (a failed correctness gate, runs that cannot support a comparison)
are not scored: they say nothing about the prediction. ``aggregate`` gives the hit rate and interval
coverage per proposer and per direction, what the lake's ``prediction_scores`` view and the UI show.
"""
from __future__ import annotations

import math
from typing import Any

MEASURED = {"better": "up", "worse": "down", "same": "flat"}


def predicted_direction(ratio: float, margin: float) -> str:
    if ratio > 1 + margin:
        return "up"
    if ratio < 1 - margin:
        return "down"
    return "flat"


def score(prediction: dict[str, Any], verdict: str, measured_ratio: float | None, margin: float) -> dict[str, Any]:
    """The score of one prediction (``scored`` False when the outcome cannot judge it)."""
    ratio = float(prediction["capacity_ratio"])
    pdir = predicted_direction(ratio, margin)
    mdir = MEASURED.get(verdict)
    if mdir is None or measured_ratio is None or measured_ratio <= 0:
        return {"scored": False, "predicted_direction": pdir, "measured_direction": None, "direction_hit": None,
                "covered": None, "abs_log_error": None}
    return {"scored": True, "predicted_direction": pdir, "measured_direction": mdir, "direction_hit": pdir == mdir,
            "covered": float(prediction["ratio_low"]) <= measured_ratio <= float(prediction["ratio_high"]),
            "abs_log_error": abs(math.log(measured_ratio / ratio))}


def aggregate(rows: list[dict[str, Any]], by: tuple[str, ...] = ("proposer",)) -> list[dict[str, Any]]:
    """Hit rate, interval coverage and median |log error| per group of scored rows."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("scored"):
            groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    out = []
    for key, rs in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        errs = sorted(r["abs_log_error"] for r in rs)
        out.append({**dict(zip(by, key)), "n": len(rs),
                    "hit_rate": sum(bool(r["direction_hit"]) for r in rs) / len(rs),
                    "coverage": sum(bool(r["covered"]) for r in rs) / len(rs),
                    "median_abs_log_error": errs[len(errs) // 2]})
    return out
