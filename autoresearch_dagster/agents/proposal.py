"""Owns the four-part proposal schema and the offline proposals derived from a diagnostic report.

A proposal is testable research: an explanation (which bottleneck, with the report's evidence),
an intervention (knob changes against the working baseline), a numeric prediction (the capacity
ratio it expects) and a falsifier (the verdict that would refute it). Until the offline proposer
lands, proposals come from two honest sources: candidate files a person wrote for the endpoint,
and the knobs the report's top hypotheses name.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoresearch_dagster.spec import KNOBS, config_hash, validate_server_config


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: Literal["capacity_ratio"] = "capacity_ratio"
    value: float = Field(description="predicted median capacity ratio candidate/baseline")
    basis: str = Field(description="where the number comes from")


class Proposal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    endpoint: str
    source: Literal["candidate_file", "diagnosis"]
    explanation: str
    intervention: dict[str, Any] = Field(description="knob -> new value, against the working baseline")
    candidate_config: dict[str, Any]
    prediction: Prediction
    falsifier: str
    hypothesis: str | None = None
    direction: str | None = None

    @property
    def config_hash(self) -> str:
        return config_hash(self.candidate_config)


def _diff(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    keys = set(baseline) | set(candidate)
    return {k: candidate.get(k) for k in sorted(keys) if candidate.get(k) != baseline.get(k)}


def _knob_names(hypothesis: dict[str, Any]) -> list[str]:
    names = []
    for k in hypothesis.get("knobs", []):
        name = k.get("name") if isinstance(k, dict) else k
        if isinstance(name, str) and name in KNOBS:
            names.append(name)
    return names


def _suggested_value(hypothesis: dict[str, Any], name: str, baseline: dict[str, Any]) -> Any:
    """The value the report suggests for a knob, else the first search value that differs from the baseline."""
    for k in hypothesis.get("knobs", []):
        if isinstance(k, dict) and k.get("name") == name and "value" in k:
            return k["value"]
    k = KNOBS[name]
    current = k.canonical(baseline.get(name, k.default))
    for v in k.search_values:
        if k.canonical(v) != current and v is not None:
            return v
    return None


def _matching_hypothesis(hypotheses: list[dict[str, Any]], knobs: set[str]) -> dict[str, Any] | None:
    for h in hypotheses:
        if knobs & set(_knob_names(h)):
            return h
    return None


def _evidence_text(h: dict[str, Any]) -> str:
    ev = h.get("evidence") or []
    parts = [e if isinstance(e, str) else (e.get("text") or e.get("finding") or str(e)) for e in ev[:3]]
    return "; ".join(str(p) for p in parts)


def make_proposals(endpoint: str, report: dict[str, Any], baseline_config: dict[str, Any],
                   candidates: dict[str, dict[str, Any]], *, margin: float,
                   tested: set[str] = frozenset(), top_hypotheses: int = 2) -> list[Proposal]:
    """Proposals for one round, candidate files first, then the top hypotheses' knobs.

    ``margin`` is the smallest ratio change the verdict can tell from noise (max(2%, noise floor));
    without a performance model the only defensible numeric prediction is "at least the margin",
    so that is what each proposal predicts. Configs equal to the baseline or already tested
    against it (``tested`` holds config hashes) are skipped."""
    hypotheses = sorted(report.get("hypotheses", []), key=lambda h: -float(h.get("score", 0.0)))
    total_score = sum(max(float(h.get("score", 0.0)), 0.0) for h in hypotheses) or 1.0
    base_hash = config_hash(baseline_config)
    out: list[Proposal] = []
    seen: set[str] = set(tested) | {base_hash}

    def falsifier(knobs: str, bottleneck: str) -> str:
        return (f"refuted if the verdict interval (90% CI) of the median capacity ratio does not rise above "
                f"{1 + margin:.3f} (verdict same or worse): then {knobs} does not relieve {bottleneck}")

    for cid, cand in sorted(candidates.items()):
        config = validate_server_config({**baseline_config, **cand})
        h_ = config_hash(config)
        change = _diff(baseline_config, config)
        if h_ in seen or not change:
            continue
        seen.add(h_)
        h = _matching_hypothesis(hypotheses, set(change))
        bottleneck = h.get("bottleneck", "the diagnosed bottleneck") if h else "no diagnosed bottleneck"
        explanation = (f"candidate file {cid} changes {', '.join(change)}; "
                       + (f"the report ranks '{bottleneck}' (score {float(h.get('score', 0)):.2f}) and names "
                          f"these knobs: {_evidence_text(h)}" if h else
                          "no hypothesis in the report names these knobs, so it is tested as given"))
        out.append(Proposal(
            id=f"{cid}", endpoint=endpoint, source="candidate_file", explanation=explanation,
            intervention=change, candidate_config=config,
            prediction=Prediction(value=round(1 + margin, 4),
                                  basis="at least the verdict margin max(2%, noise floor)"),
            falsifier=falsifier(", ".join(change), bottleneck),
            hypothesis=h.get("bottleneck") if h else None, direction=h.get("direction") if h else None))

    for h in hypotheses[:top_hypotheses]:
        share = max(float(h.get("score", 0.0)), 0.0) / total_score
        for name in _knob_names(h):
            value = _suggested_value(h, name, baseline_config)
            if value is None:
                continue
            config = validate_server_config({**baseline_config, name: value})
            h_ = config_hash(config)
            if h_ in seen:
                continue
            seen.add(h_)
            bottleneck = h.get("bottleneck", "?")
            out.append(Proposal(
                id=f"diag-{name}-{value}".replace(" ", ""), endpoint=endpoint, source="diagnosis",
                explanation=f"the report ranks '{bottleneck}' with score {float(h.get('score', 0)):.2f}: "
                            f"{_evidence_text(h)}; {name}: {KNOBS[name].tradeoff}",
                intervention={name: value}, candidate_config=config,
                prediction=Prediction(value=round(1 + margin, 4),
                                      basis=f"at least the verdict margin; the hypothesis carries "
                                            f"{share:.0%} of the report's total score"),
                falsifier=falsifier(f"{name}={value}", bottleneck),
                hypothesis=bottleneck, direction=h.get("direction")))
    return out
