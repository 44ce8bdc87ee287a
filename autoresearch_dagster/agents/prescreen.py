"""Owns the campaign's pre-screen: candidates are tried on the calibrated emulator before the real engine.

With ``CampaignSettings.prescreen`` on, a round's planned candidates (up to ``prescreen_pool`` x the
round's slots, in the orchestrator's order) are each predicted on the endpoint's calibrated emulator
(``agents.surrogate``: the latest stored calibration, refitted on this era's measured baseline) with
the campaign's verdict-learned correction (``Corrector``), whatever proposer wrote them. A candidate
is **promising** when that predicted capacity ratio is at least ``1 + gain x margin``, the era's
verdict margin times ``prescreen_gain`` (1.0: a predicted gain the verdict could confirm), and the
emulator finds it feasible. Only promising candidates go to the real engine, best-ordered as
planned, up to the round's slots; the rest are recorded as screened with the emulator's numbers.
Controls, rollbacks, engine patches, exploratory experiments (``agents.offline.exploration_pick``: a direction
with nothing measured, whose interval reaches the floor) and follow-ups whose change already measured better are exempt:
their case rests on measurements (or on nothing the emulator models), not on the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXEMPT_SOURCES = ("rollback", "measured_follow_up")


@dataclass
class Screened:
    kept: list[Any]
    screened: list[dict[str, Any]] = field(default_factory=list)  # rejected-entry dicts with status "screened"
    predictions: dict[str, dict[str, Any]] = field(default_factory=dict)  # proposal id -> emulator prediction


def exempt(p: Any) -> bool:
    # an exploratory experiment already rests on the calibrated interval, not the point estimate
    return p.kind == "control" or p.is_patch or p.source in EXEMPT_SOURCES or p.source.startswith("explore")


def prescreen(proposals: list[Any], predictor: Any, base_config: dict[str, Any], *, margin: float, gain: float,
              slots: int) -> Screened:
    """The promising ``proposals`` (at most ``slots``, order kept) and the screened ones (see the module docstring)."""
    floor = 1 + gain * margin
    todo = [p for p in proposals if not exempt(p)]
    preds = predictor.predict(base_config, [p.candidate_config for p in todo]) if todo else []
    by_id = {p.id: pr for p, pr in zip(todo, preds)}
    out = Screened(kept=[])
    for p in proposals:
        pr = by_id.get(p.id)
        if pr is not None:
            out.predictions[p.id] = {k: pr.get(k) for k in ("ratio", "raw_ratio", "low", "high", "feasible", "reason", "base_capacity", "capacity")}
        promising = pr is None or (pr.get("feasible") and float(pr["ratio"]) >= floor)
        if promising and len(out.kept) < slots:
            out.kept.append(p)
            continue
        if promising:
            continue  # promising but past the round's slots: planned again next round if still the best
        why = (f"pre-screen: the calibrated emulator predicts {float(pr['ratio']):.3f}x (uncorrected "
               f"{float(pr['raw_ratio']):.3f}x), below the promising floor {floor:.3f} (1 + {gain:g} x margin "
               f"{margin:.3f})") if pr.get("feasible") else f"pre-screen: infeasible on the emulator ({pr.get('reason')})"
        out.screened.append({"proposal_id": p.id, "proposer": p.proposer, "direction": p.direction, "kind": p.kind,
                             "parents": p.parent_ids, "intervention": p.intervention.delta(), "reasons": [why],
                             "status": "screened", "emulator": out.predictions[p.id]})
    return out
