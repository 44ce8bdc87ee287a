"""Owns the promotion rule: which tested candidate, if any, becomes the new working baseline."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PromotionDecision:
    promote: bool
    candidate_id: str | None
    server_config: dict[str, Any] | None
    ratio_median: float | None
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide_promotion(results: list[dict[str, Any]]) -> PromotionDecision:
    """Promote the "better" candidate with the highest CI lower bound; only a valid verdict whose
    correctness gate (when it had one) passed and that was confirmed on fresh runs counts."""
    eligible = [r for r in results
                if r.get("verdict") == "better" and not r.get("invalid_reasons")
                and r.get("confirmed", True)
                and (r.get("correctness") is None or r["correctness"].get("passed"))]
    if not eligible:
        summary = ", ".join(f"{r.get('candidate_id')}: {r.get('verdict')}" for r in results) or "nothing tested"
        return PromotionDecision(False, None, None, None, f"no confirmed better candidate ({summary})")
    best = max(eligible, key=lambda r: (r.get("ci_low") or 0.0, r.get("ratio_median") or 0.0))
    return PromotionDecision(
        True, best["candidate_id"], best["candidate_config"], best.get("ratio_median"),
        f"{best['candidate_id']} is better: median ratio {best.get('ratio_median'):.3f}, "
        f"CI [{best.get('ci_low'):.3f}, {best.get('ci_high'):.3f}], margin {best.get('margin'):.3f}",
        evidence={k: best.get(k) for k in ("ratio_median", "ci_low", "ci_high", "margin", "runs_baseline",
                                           "runs_candidate", "lossy", "correctness", "experiment_id")})
