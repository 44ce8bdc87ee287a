"""Owns the campaign's drafter adaptation: the speculative direction's "adapt the drafter" experiment.

When the speculative direction is open (``CampaignSettings.drafter``), a round may propose serving a
drafter adapted to the endpoint's own traffic. Nothing about its acceptance is assumed:

1. **Rehearsal** (``rehearse``): a short training run (``drafter_rehearsal_steps`` head steps, a small
   acceptance check) on the pool's training split, by the same trainer as ``autoresearch drafter train``.
   It goes on only when the adapted head accepts at least ``drafter_min_gain`` x the starting (stock)
   head's mean acceptance length on the held-out slice and the greedy gate passed.
2. **Proposal** (``proposal_for``): the rehearsal's measured acceptance distribution is what the
   calibrated surrogate predicts with (``speculative_draft_model_path`` names the directory holding
   ``acceptance.json``; the emulator reads it in place of the algorithm's rate), at each draft depth the
   drafter was measured for; the depth whose upper bound is best becomes a four-part proposal when that
   bound reaches the verdict margin. The candidate names the directory the full training will write.
3. **Training** (``train_full``), when the experiment starts: the full recipe, then the experiment
   measures the candidate like any other (shared harness, verdict, correctness gate).

Training wall time is counted as GPU time in the campaign budget (the trainer holds one device), and
``drafter_variants`` caps how many drafters (rehearsals included) one campaign trains.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from autoresearch_dagster.agents.guardrails import Guardrails, check
from autoresearch_dagster.agents.offline import Predictor, diff
from autoresearch_dagster.agents.proposal import Intervention, KnobChange, Proposal, ResearchBrief
from autoresearch_dagster.spec import SpecError

SOURCE = "drafter_adaptation"
PATH_KNOB = "speculative_draft_model_path"
DEPTHS = (1, 2, 3, 4)


def _settings(overrides: dict[str, Any], **kw: Any):
    from autoresearch_dagster.drafter.settings import DrafterSettings
    return replace(DrafterSettings(**overrides), **kw)


def full_steps(overrides: dict[str, Any]) -> int:
    """Head steps of the full training run (the trainer's default unless overridden)."""
    return _settings(overrides).steps


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    acc = report.get("acceptance") or {}
    held, serving = acc.get("held_out") or {}, acc.get("serving") or {}
    return {"held_out_starting": (held.get("starting") or {}).get("mean_accept_length"),
            "held_out_adapted": (held.get("adapted") or {}).get("mean_accept_length"),
            "held_out_ratio": held.get("adapted_over_starting"),
            "serving_adapted": (serving.get("adapted") or {}).get("mean_accept_length"),
            "serving_ratio": serving.get("adapted_over_starting"),
            "gate_passed": bool((report.get("gate") or {}).get("passed")),
            "wall_s": float(report.get("wall_s") or 0.0), "steps": (report.get("settings") or {}).get("steps")}


def _train(pool_path: str | Path, out_dir: Path, settings, say) -> dict[str, Any]:
    import torch

    from autoresearch_dagster.drafter.train import run_train
    # one torch thread: the tiny models gain nothing from more, and beside the campaign's worker processes
    # two threads ran the same steps >10x slower (benchmarks/bench_drafter.py --threads)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # the CPU stand-in target is built once per campaign (the rehearsal's), as a served model exists once
        return run_train(pool_path, out_dir, settings=settings, log=say, target_cache=out_dir.parent / "targets")
    finally:
        torch.set_num_threads(prev)


def rehearse(pool_path: str | Path, out_dir: Path, *, steps: int, requests: int, overrides: dict[str, Any],
             say=lambda _m: None) -> dict[str, Any]:
    """The rehearsal's summary (its files under ``out_dir``); raises SpecError when the pool cannot train one."""
    s = _settings(overrides, steps=steps, measure_requests=requests)
    return summarize(_train(pool_path, out_dir, s, lambda m: say("drafter rehearsal: " + m)))


def train_full(pool_path: str | Path, out_dir: Path, *, overrides: dict[str, Any], say=lambda _m: None
               ) -> dict[str, Any]:
    return summarize(_train(pool_path, out_dir, _settings(overrides), lambda m: say("drafter training: " + m)))


def rehearsal_verdict(summary: dict[str, Any], min_gain: float) -> str | None:
    """Why the rehearsal stops here (None: it goes on to a proposal)."""
    if not summary["gate_passed"]:
        return "the greedy gate failed: speculative output differed from target-only decoding"
    ratio = summary["held_out_ratio"]
    if ratio is None or ratio < min_gain:
        return (f"the adapted head accepts {summary['held_out_adapted']} tokens per verify against the starting "
                f"head's {summary['held_out_starting']} on the held-out slice ({ratio}x, under the "
                f"{min_gain:g}x needed for a full training run)")
    return None


def proposal_for(brief: ResearchBrief, predictor: Predictor, guardrails: Guardrails, *, rehearsal_dir: Path,
                 full_dir: Path, summary: dict[str, Any], tested: set[str] | dict[str, Any]
                 ) -> tuple[Proposal | None, str]:
    """The drafter experiment at its best predicted draft depth, or None and why not."""
    from autoresearch_dagster.spec import config_hash

    base, resolved = dict(brief.baseline_config), dict(brief.resolved_baseline)
    margin = float(brief.noise.get("margin") or 0.02)
    floor = 1 + margin
    algo = base.get("speculative_algorithm") or "EAGLE"
    cfgs = [{**base, "speculative_algorithm": algo, "speculative_eagle_topk": 1, "speculative_num_steps": d,
             PATH_KNOB: str(rehearsal_dir)} for d in DEPTHS]
    for c in cfgs:
        c.pop("speculative_num_draft_tokens", None)  # topk 1: the verify width follows the depth
    preds = predictor.predict(base, cfgs)
    scored = sorted(((float(p["high"]), c, p) for c, p in zip(cfgs, preds) if p.get("feasible")
                     and p.get("high") is not None), key=lambda x: -x[0])
    if not scored:
        return None, "drafter adaptation: no draft depth is feasible on this deployment"
    hi, cfg, pred = scored[0]
    depth = cfg["speculative_num_steps"]
    if hi < floor:
        return None, (f"drafter adaptation: the rehearsal's measured acceptance predicts at best {pred['ratio']:.3f}x "
                      f"[{pred['low']:.3f}, {hi:.3f}] (depth {depth}), under the verdict margin {floor:.3f}")
    final = {**cfg, PATH_KNOB: str(full_dir)}
    delta = diff(base, final)
    explanation = (f"a drafter adapted to this endpoint's traffic accepts more drafts than a stock one: the rehearsal "
                   f"({summary['steps']} steps) measured {summary['held_out_adapted']} tokens per verify against the "
                   f"starting head's {summary['held_out_starting']} on held-out training traffic "
                   f"({summary['held_out_ratio']}x); with that acceptance the calibrated surrogate predicts "
                   f"{pred['ratio']:.3f}x at draft depth {depth}")
    prop = Proposal(
        id=f"r{brief.round}-drafter-{config_hash(final)[:6]}", endpoint=brief.endpoint, campaign_id=brief.campaign_id,
        round=brief.round, proposer="orchestrator", source=SOURCE, direction="speculative", kind="experiment",
        question="Does a drafter adapted to the endpoint's traffic raise capacity within the SLA?",
        explanation=explanation,
        evidence=[f"rehearsal acceptance (held out): starting {summary['held_out_starting']}, adapted "
                  f"{summary['held_out_adapted']}; serving split adapted {summary['serving_adapted']}",
                  f"surrogate with the rehearsal's acceptance: {pred['ratio']:.3f}x [{pred['low']:.3f}, {hi:.3f}]"],
        intervention=Intervention(changes=[KnobChange(knob=k, value=v) for k, v in delta.items()],
                                  justification="the drafter is trained on the pool's training split only; its "
                                                "acceptance is measured by real speculative decoding"),
        prediction=predictor.prediction(pred),
        falsification=(f"refuted if the verdict is not better or the measured ratio falls outside "
                       f"[{pred['low']:.3f}, {hi:.3f}]; the full training's acceptance is in the record"))
    res = check(prop, base, resolved, guardrails)
    if not res.accepted:
        return None, "drafter adaptation refused by the guardrails: " + "; ".join(res.reasons)[:200]
    if config_hash(res.candidate_config) in tested:
        return None, "drafter adaptation: this drafter config was already tested"
    return prop.model_copy(update={"candidate_config": res.candidate_config, "guardrail_notes": res.notes}), (
        f"drafter adaptation proposed at depth {depth} (rehearsal {summary['held_out_ratio']}x held out)")


def pool_path(pool: Any) -> str | Path:
    p = getattr(pool, "path", pool)
    if p is None:
        raise SpecError("the campaign's pool has no path to train a drafter from")
    return p
