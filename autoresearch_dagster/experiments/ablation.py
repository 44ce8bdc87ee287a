"""Owns ablations: a combined candidate against its controls (each change alone) and leave-one-out runs."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from autoresearch_dagster.engines.base import Engine
from autoresearch_dagster.experiments.campaign import Campaign
from autoresearch_dagster.experiments.experiment import ExperimentResult, run_experiment
from autoresearch_dagster.experiments.runs import HarnessSettings, Progress
from autoresearch_dagster.spec import Budget, EndpointSpec


@dataclass
class AblationResult:
    """A combined candidate with controls (each change alone) and leave-one-out ablations."""
    combined: ExperimentResult
    singles: dict[str, ExperimentResult]
    leave_outs: dict[str, ExperimentResult]
    attribution: dict[str, dict[str, Any]]
    summary: str

    def to_dict(self) -> dict:
        return {"combined": self.combined.to_dict(), "singles": {k: v.to_dict() for k, v in self.singles.items()},
                "leave_outs": {k: v.to_dict() for k, v in self.leave_outs.items()},
                "attribution": self.attribution, "summary": self.summary}


def attribute(single: str, leave_out: str) -> str:
    """Role of one change from its control (alone vs baseline) and its ablation (combined minus it vs combined)."""
    if leave_out == "invalid" or single == "invalid":
        return "unknown (invalid runs)"
    if leave_out == "worse":
        return "carries gain"  # removing it from the combination loses capacity
    if leave_out == "better":
        return "harmful in combination"
    if single == "better":
        return "redundant (gains alone, adds nothing to the others)"
    if single == "worse":
        return "harmful alone, neutral in combination"
    return "no effect"


def run_ablation(endpoint: EndpointSpec, baseline_config: dict[str, Any], changes: dict[str, dict[str, Any]],
                 pool: Any, *, engine: Engine, results: Any = None, settings: HarnessSettings | None = None,
                 budget: Budget | None = None, noise_cv: float | None = None, campaign: Campaign | None = None,
                 progress: Progress = None) -> AblationResult:
    """Test changes found separately, combined: combined vs baseline, each change alone vs baseline (controls),
    and combined-minus-one vs combined (leave-one-out), so the verdict says which change carries the gain."""
    if len(changes) < 2:
        raise ValueError("run_ablation: needs at least two named changes")
    keys = [set(c) for c in changes.values()]
    overlap = {k for i, a in enumerate(keys) for b in keys[i + 1:] for k in a & b}
    if overlap:
        raise ValueError(f"run_ablation: changes overlap on knobs {sorted(overlap)}")
    combined_cfg = dict(baseline_config)
    for c in changes.values():
        combined_cfg.update(c)
    parent = f"a-{uuid.uuid4().hex[:12]}"
    kw = dict(engine=engine, results=results, settings=settings, budget=budget, noise_cv=noise_cv,
              campaign=campaign, parent_id=parent, progress=progress)
    combined = run_experiment(endpoint, baseline_config, combined_cfg, pool, kind="ablation:combined", **kw)
    singles, leave_outs, attribution = {}, {}, {}
    for name, change in changes.items():
        singles[name] = run_experiment(endpoint, baseline_config, {**baseline_config, **change}, pool,
                                       kind=f"ablation:single:{name}", **kw)
        without = dict(baseline_config)
        for other, c in changes.items():
            if other != name:
                without.update(c)
        leave_outs[name] = run_experiment(endpoint, combined_cfg, without, pool, kind=f"ablation:leave_out:{name}", **kw)
        attribution[name] = {"role": attribute(singles[name].verdict, leave_outs[name].verdict),
                             "single_verdict": singles[name].verdict,
                             "single_ratio": singles[name].stats.ratio_median if singles[name].stats else None,
                             "leave_out_verdict": leave_outs[name].verdict,
                             "leave_out_ratio": leave_outs[name].stats.ratio_median if leave_outs[name].stats else None}
    carriers = [n for n, a in attribution.items() if a["role"] == "carries gain"]
    summary = (f"combined: {combined.verdict}"
               + (f" (ratio {combined.stats.ratio_median:.4f})" if combined.stats else "")
               + f"; gain carried by: {', '.join(carriers) if carriers else 'no single change'}; "
               + "; ".join(f"{n}: {a['role']}" for n, a in attribution.items()))
    return AblationResult(combined=combined, singles=singles, leave_outs=leave_outs, attribution=attribution,
                          summary=summary)
