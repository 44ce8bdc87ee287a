"""Owns the offline proposer: recipes for the diagnosed bottlenecks, then model-based search inside the
session's direction, with predictions from the surrogate corrected by the campaign's verdicts.

The default proposer: no key, no network, deterministic for a seed. One session per research
direction: the recipes of that direction, ranked by how strongly the diagnosis points at the
bottlenecks they address, give the seed candidates; a TPE search (``agents.search``) over the
direction's knobs (within the guardrails' justified step of the baseline) continues from those seeds
and from the configs this campaign has measured, scored by the surrogate (``agents.surrogate``);
infeasible configs come back from the surrogate without an experiment and the search learns them.
The best distinct candidates predicted to beat the baseline become four-part proposals. The session's
reasoning trace (recipes considered, every search trial with its predicted value, the surrogate's
model and calibration, the corrector's residuals) is returned for the orchestrator to keep.
"""
from __future__ import annotations

from typing import Any

from autoresearch_dagster.agents.guardrails import Guardrails
from autoresearch_dagster.agents.proposal import (DIRECTION_NAMES, Intervention, KnobChange, LatencyTerm, Prediction,
                                                  Proposal, ResearchBrief, Session, fails_gate, lossy_settings,
                                                  stakes_too_much)
from autoresearch_dagster.agents.recipes import Recipe, load_recipes, resolve_move
from autoresearch_dagster.agents.search import SearchSpace, normalize, search, static_problem
from autoresearch_dagster.agents.surrogate import Corrector, Surrogate
from autoresearch_dagster.emulator.catalog import model_traits
from autoresearch_dagster.spec import config_hash, knob_table, knobs_for, table_of


def diff(base: dict[str, Any], config: dict[str, Any], engine: str | None = None) -> dict[str, Any]:
    """Knobs whose value differs between two configs: an unset knob counts as its default (None: the
    server resolves it). ``engine`` names the knob table; None: the table that has every knob of both configs
    (SGLang's first; the tables share only a few names, with the same defaults)."""
    keys = set(base) | set(config)
    t = table_of(base, config, engine=engine)
    return {k: config.get(k, t[k].default) for k in sorted(keys, key=list(t).index)
            if t[k].canonical(config.get(k, t[k].default)) != t[k].canonical(base.get(k, t[k].default))}


class Predictor:
    """Surrogate + corrector: predicted ratios (with intervals and latency terms) of candidates against a
    baseline. Shared by the offline proposer and the orchestrator's controls and combinations."""

    def __init__(self, surrogate: Surrogate, corrector: Corrector):
        self.surrogate, self.corrector = surrogate, corrector

    def predict(self, base: dict[str, Any], configs: list[dict[str, Any]], *, latency_metric: str = "tpot",
                confidence: float = 0.8) -> list[dict[str, Any]]:
        points = self.surrogate.evaluate([base, *configs])
        b, out = points[0], []
        for cfg, p in zip(configs, points[1:]):
            if not (b.feasible and b.capacity_rps > 0):
                out.append({"feasible": False, "reason": f"the surrogate cannot model the baseline: {b.reason}"})
                continue
            if not p.feasible or p.capacity_rps <= 0:
                out.append({"feasible": False, "reason": p.reason or "no capacity at the SLA on the surrogate"})
                continue
            raw = p.capacity_rps / b.capacity_rps
            ratio, lo, hi, basis = self.corrector.predict(list(diff(base, cfg, self.surrogate.endpoint.engine)), raw,
                                                       confidence=confidence)
            lat_b, lat_c = b.latency_at(latency_metric, b.capacity_rps), p.latency_at(latency_metric, b.capacity_rps)
            change = (lat_c / lat_b - 1.0) if lat_b and lat_c else None
            out.append({"feasible": True, "raw_ratio": raw, "ratio": ratio, "low": lo, "high": hi, "basis": basis,
                        "base_capacity": b.capacity_rps, "capacity": p.capacity_rps, "limiting": b.limiting,
                        "latency_metric": latency_metric, "latency_change": change})
        return out

    def prediction(self, pred: dict[str, Any], *, confidence: float = 0.8) -> Prediction:
        lat = ([LatencyTerm(metric=pred["latency_metric"], quantile=99.0,
                            change=max(-0.99, round(pred["latency_change"], 4)))]
               if pred.get("latency_change") is not None else [])
        return Prediction(capacity_ratio=round(pred["ratio"], 4), ratio_low=round(pred["low"], 4),
                          ratio_high=round(pred["high"], 4), confidence=confidence, latency=lat,
                          basis=f"{pred['basis']} (surrogate {self.surrogate.model_id}: baseline "
                                f"{pred['base_capacity']:.2f} req/s, candidate {pred['capacity']:.2f} req/s)")


class OfflineProposer:
    name = "offline"

    def __init__(self, predictor: Predictor, guardrails: Guardrails, *, recipes: list[Recipe] | None = None,
                 search_trials: int = 6, batch: int = 2, min_gain: float = 0.01, confidence: float = 0.8):
        """``min_gain``: the smallest predicted gain worth an experiment (at least half the brief's
        verdict margin: a smaller one could not be told from noise)."""
        self.predictor = predictor
        self.guardrails = guardrails
        self.recipes = recipes if recipes is not None else load_recipes()
        self.search_trials, self.batch = search_trials, batch
        self.min_gain, self.confidence = min_gain, confidence

    def _recipes(self, brief: ResearchBrief, traits: frozenset[str]) -> list[tuple[Recipe, float]]:
        scores = {h.get("bottleneck"): float(h.get("score") or 0.0) for h in brief.hypotheses}
        mine = [r for r in self.recipes if r.direction == brief.direction and brief.gpus >= r.min_gpus
                and r.engine == knob_table(brief.engine) and (r.model_trait is None or r.model_trait in traits)]
        return sorted(((r, r.relevance(scores)) for r in mine), key=lambda x: (-x[1], x[0].name))

    def propose(self, brief: ResearchBrief, tools: Any = None) -> Session:
        base, resolved = dict(brief.baseline_config), dict(brief.resolved_baseline)
        g = self.guardrails
        traits = model_traits(brief.model)  # the card's, read once (a config.json path is a file)
        recipes = self._recipes(brief, traits)
        seeds: list[tuple[dict[str, Any], str]] = []
        origin: dict[str, tuple[Recipe, list[str]]] = {}
        for recipe, _score in recipes:
            for i in range(len(recipe.moves)):
                move = resolve_move(recipe, i, resolved)
                if move is None:
                    continue
                cfg = normalize({**base, **move.delta}, base, resolved, brief.engine)
                if static_problem(cfg, brief.gpus, brief.engine):
                    continue
                h = config_hash(cfg)
                if h not in origin:
                    origin[h] = (recipe, move.notes)
                    seeds.append((cfg, move.label))
        knobs = sorted({k for r, _ in recipes for m in r.moves for k in m}
                       | {k for k, kn in knobs_for(brief.engine).items() if kn.direction == brief.direction})
        space = SearchSpace.full(brief.gpus, base, brief.engine, traits).around(knobs, resolved,
                                                                                max_step=g.justified_step)
        tested = {e.get("candidate_hash") for e in brief.history if e.get("baseline_hash") == brief.baseline_hash}
        tested |= set(brief.tested_configs)
        history = [(e["candidate_config"], float(e["ratio_median"])) for e in brief.history
                   if e.get("baseline_hash") == brief.baseline_hash and e.get("ratio_median")
                   and e.get("candidate_config") is not None]
        metric = recipes[0][0].latency_metric if recipes else "tpot"

        preds: dict[str, dict[str, Any]] = {}  # config hash -> the surrogate's prediction (the interval too)

        def objective(configs: list[dict[str, Any]]) -> list[tuple[float | None, str]]:
            out = []
            for cfg, p in zip(configs, self.predictor.predict(base, configs, latency_metric=metric,
                                                              confidence=self.confidence)):
                preds[config_hash(cfg)] = p
                problem = static_problem(cfg, brief.gpus, brief.engine)
                failed = fails_gate(cfg, base, brief.gate_failures)
                if failed:
                    problem = f"{', '.join(failed)} failed the correctness gate before"
                problem = problem or stakes_too_much(cfg, base)
                if problem or not p["feasible"]:
                    out.append((None, problem or p["reason"]))
                else:
                    out.append((p["ratio"], f"surrogate {p['capacity']:.2f} req/s, ratio {p['raw_ratio']:.3f}"))
            return out

        tpe = search(space, base, objective, seeds=seeds, history=history, n_trials=self.search_trials if space.choices
                     else 0, batch=self.batch, seed=brief.seed * 7919 + brief.round * 31 + len(brief.direction),
                     exclude=tested | {config_hash(base)}, resolved=resolved)
        min_gain = max(self.min_gain, float(brief.noise.get("margin") or 0.0) / 2)
        # parsimony: among candidates the surrogate cannot tell apart, the one that changes fewer knobs first
        penalty = max(0.005, min_gain / 2)
        ranked = sorted((t for t in tpe.trials if t.value is not None and t.source != "history"),
                        key=lambda t: -(t.value - penalty * max(0, len(diff(base, t.config, brief.engine)) - 1)))
        chosen, knob_sets, risks = [], [], []
        for t in ranked:
            h = config_hash(t.config)
            if h in tested or h == config_hash(base) or any(config_hash(c.config) == h for c in chosen):
                continue
            if t.value < 1.0 + min_gain or len(chosen) >= brief.max_proposals:
                break
            ks = frozenset(diff(base, t.config, brief.engine))
            if ks in knob_sets and len(chosen) + 1 >= brief.max_proposals:
                continue  # keep the last slot for a different set of knobs
            # two candidates staking on the same untested lossy settings fail the gate together: vary the bet
            risk = frozenset(lossy_settings(t.config)) - frozenset(lossy_settings(base))
            if risk and any(risk & r for r in risks):
                continue
            chosen.append(t)
            knob_sets.append(ks)
            risks.append(risk)
        explore = None
        if not chosen and not measured_in(brief):
            explore = exploration_pick(ranked, preds, tested | {config_hash(base)}, 1.0 + min_gain)
            if explore is not None:
                chosen.append(explore)
        trace = {"proposer": self.name, "direction": brief.direction, "question": brief.question,
                 "recipes": [{"name": r.name, "relevance": s, "addresses": list(r.addresses)} for r, s in recipes],
                 "seeds": [{"label": label, "config_hash": config_hash(c)} for c, label in seeds],
                 "space": {k: list(v) for k, v in space.choices.items()}, "space_size": space.size,
                 "trials": [t.to_dict() for t in tpe.trials], "surrogate_model": self.predictor.surrogate.model_id,
                 "surrogate_evaluations": self.predictor.surrogate.evaluations,
                 "calibration": self.predictor.surrogate.calibration,
                 "corrector_residuals": len(self.predictor.corrector.residuals),
                 "chosen": [config_hash(t.config) for t in chosen],
                 "exploration": None if explore is None else {
                     "config_hash": config_hash(explore.config), "point": preds[config_hash(explore.config)]["ratio"],
                     "upper": preds[config_hash(explore.config)]["high"], "floor": 1.0 + min_gain}}
        proposals = []
        for k, t in enumerate(chosen):
            rec, notes = origin.get(config_hash(t.config), (None, []))
            if rec is None:  # a search trial: explained by the recipe whose knobs it shares most
                touched = set(diff(base, t.config, brief.engine))
                rec = max((r for r, _ in recipes), key=lambda r: len(touched & {x for m in r.moves for x in m}),
                          default=None)
            source = "recipe" if notes or config_hash(t.config) in origin else "search"
            proposals.append(self._proposal(brief, t.config, rec, notes, k,
                                            source=EXPLORE if t is explore else source,
                                            floor=1.0 + min_gain if t is explore else None))
        return Session(proposer=self.name, direction=brief.direction, proposals=proposals, trace=trace)

    def _proposal(self, brief: ResearchBrief, config: dict[str, Any], recipe: Recipe | None, notes: list[str],
                  k: int, *, source: str, floor: float | None = None) -> Proposal:
        base = brief.baseline_config
        delta = diff(base, config, brief.engine)
        metric = recipe.latency_metric if recipe else "tpot"
        pred = self.predictor.predict(base, [config], latency_metric=metric, confidence=self.confidence)[0]
        prediction = self.predictor.prediction(pred, confidence=self.confidence)
        addressed = set(recipe.addresses) if recipe else set()
        evidence = [f"{h['bottleneck']} (score {float(h.get('score') or 0):.2f}): {line}"
                    for h in brief.hypotheses if h.get("bottleneck") in addressed for line in (h.get("evidence") or [])[:2]]
        evidence.append(f"surrogate: baseline {pred['base_capacity']:.2f} req/s"
                        + (f" limited by {pred['limiting']}" if pred.get("limiting") else "")
                        + f", candidate {pred['capacity']:.2f} req/s")
        why = recipe.explanation if recipe else f"the {DIRECTION_NAMES[brief.direction]} search found this region"
        explanation = (f"{why} Diagnosis: "
                       + ("; ".join(evidence[:3]) if len(evidence) > 1 else "no hypothesis of this direction scored")
                       + f". Surrogate search: {', '.join(f'{n}={v!r}' for n, v in delta.items())} predicts "
                         f"{prediction.capacity_ratio:.3f}x capacity.")
        resolved = brief.resolved_baseline
        big = [n for n, v in delta.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(resolved.get(n), (int, float))
               and not isinstance(resolved.get(n), bool) and v > 0 and resolved[n] > 0
               and max(v / resolved[n], resolved[n] / v) > self.guardrails.max_numeric_step]
        justification = (f"the surrogate ({self.predictor.surrogate.model_id}) predicts ratio {pred['raw_ratio']:.3f} "
                         f"with {', '.join(f'{n}={delta[n]}' for n in big)}, a step beyond "
                         f"x{self.guardrails.max_numeric_step:g} of the resolved baseline") if big else ""
        if floor is not None:  # an exploratory experiment: its case is the interval, not the point estimate
            explanation += (f" Exploration: no experiment of this direction was measured on this baseline; the "
                            f"point estimate {prediction.capacity_ratio:.3f}x is below the {floor:.3f} floor, but the "
                            f"{self.confidence:.0%} interval reaches {prediction.ratio_high:.3f}x, so only a "
                            "measurement can close the direction.")
        lat_text = (f"; {metric.upper()} p99 at the baseline's capacity rate should change by "
                    f"{pred['latency_change']:+.0%}" if pred.get("latency_change") is not None else "")
        falsification = ((recipe.falsification + " ") if recipe else "") + (
            f"Numerically: refuted if the measured median capacity ratio falls outside "
            f"[{prediction.ratio_low:.3f}, {prediction.ratio_high:.3f}] or the verdict is not better{lat_text}.")
        changes = [KnobChange(knob=n, value=v, why=knobs_for(brief.engine)[n].tradeoff) for n, v in delta.items()]
        pid = f"r{brief.round}-{brief.direction[:5]}-{k}-{config_hash(config)[:6]}"
        return Proposal(id=pid, endpoint=brief.endpoint, campaign_id=brief.campaign_id, round=brief.round,
                        proposer=self.name, source=f"{source}:{recipe.name}" if recipe else source,
                        direction=brief.direction, question=brief.question, explanation=explanation,
                        evidence=evidence, intervention=Intervention(changes=changes, justification=justification),
                        prediction=prediction, falsification=falsification,
                        controls=[f"each change alone against the baseline ({', '.join(delta)})"] if len(delta) > 1 else [],
                        follow_ups=[f"if better: the {DIRECTION_NAMES[brief.direction]} knobs around "
                                    f"{', '.join(delta)} at the new limit"] + notes)


EXPLORE = "explore"


def measured_in(brief: ResearchBrief) -> bool:
    """Whether an experiment of the brief's direction was measured (has a verdict) on the brief's baseline."""
    return any(e.get("direction") == brief.direction and e.get("verdict") and e.get("baseline_hash") == brief.baseline_hash
               for e in brief.history)


def exploration_pick(ranked: list[Any], preds: dict[str, dict[str, Any]], excluded: set[str],
                     floor: float) -> Any | None:
    """The untested feasible trial with the highest upper interval bound (optimism under uncertainty), or None.

    A direction whose every candidate the surrogate puts below the floor is not closed on the surrogate's word
    alone while none of its experiments was measured: the candidate whose interval reaches furthest is measured.
    Its upper bound must reach ``floor`` (a gain the verdict could confirm is inside the interval), else the
    surrogate is confident there is nothing and the direction closes with that reason.
    """
    best, best_hi = None, floor
    for t in ranked:
        h = config_hash(t.config)
        p = preds.get(h)
        if h in excluded or p is None or not p.get("feasible") or p.get("high") is None:
            continue
        if float(p["high"]) >= best_hi:
            best, best_hi = t, float(p["high"])
    return best
