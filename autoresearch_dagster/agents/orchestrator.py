"""Owns the orchestrator: which research directions a round opens, the proposer sessions it runs in
parallel (one per direction and proposer), the guardrails and the choice of the round's experiments.

Directions are ranked by the diagnosis (the best hypothesis score of each direction) plus a bonus
for a direction this campaign has not tried yet; a direction whose last ``exhausted_after``
experiments gained nothing is set aside while others remain (switch direction when one keeps
giving "same"). Each session gets a ``ResearchBrief`` with one research question; sessions run in
parallel threads and their transcripts / reasoning traces are written next to the round plan and
linked from every proposal. The orchestrator then adds what no single session sees:
- controls: after a promotion that changed knobs of several directions, each direction's knobs reverted
  alone (does every earlier choice still pay?);
- follow-ups: good-but-different configs of the diversity pool, re-applied on the new baseline (each
  is offered until it runs or is refused);
- combinations: the best candidates of two directions with disjoint knobs, combined (their singles
  in the same round are the controls that say which change carries the gain) where the model predicts
  an added gain; else the pair of the two best directions only, and only in a slot that would otherwise
  go to a variant of a chosen idea (a 2x2 design: additivity is what the surrogate knows least);
- the joint candidate: forward selection over every idea the sessions scored (their proposals and
  search trials, across directions): start from the best, add the next idea whose knobs are disjoint
  while the predictor says the gain grows by more than a quarter of the verdict margin, up to the
  guardrails' ``max_changes``. It is how one round reaches a region no single direction's search
  covers (each session searches its own knobs only); the singles beside it say which change carries
  the gain.
Every proposal passes ``agents.guardrails``; a lossy value that already failed the correctness gate
and a config already tested under the same conditions are refused with the reason. The round runs
the best candidate of each direction first (the highest predicted first), then the rest by predicted
gain, up to the round's budget, one candidate per new lossy setting (and none with two). Only
evidence-supported candidates are run: a predicted gain of at least the noise floor's margin / 2, a
follow-up whose change measured better (a measured gain is evidence the surrogate cannot overrule: its
model is wrong in ways only experiments show), or a control. A round with none left is how a campaign
runs out of ideas.
"""
from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoresearch_dagster.agents.guardrails import Guardrails, check
from autoresearch_dagster.agents.offline import Predictor, diff
from autoresearch_dagster.agents.proposal import (DIRECTION_NAMES, DIRECTIONS, Intervention, KnobChange, Proposal,
                                                  ResearchBrief, Session, fails_gate, new_lossy, stakes_too_much)
from autoresearch_dagster.agents.search import SearchSpace, normalize, static_problem
from autoresearch_dagster.outputs.files import json_safe, write_json
from autoresearch_dagster.spec import KNOBS_BY_ENGINE, config_hash, knobs_for

EXPLORE_BONUS = 0.05
FACTORIAL = "factorial"  # the pair of the two best directions the model sees no added gain in: a free slot's use
MEASURED = "measured_follow_up"  # the source of a follow-up whose change measured better: evidence by itself


@dataclass
class DirectionStat:
    tried: int = 0
    better: int = 0
    streak: int = 0  # consecutive experiments of this direction without a gain

    def record(self, verdict: str) -> None:
        self.tried += 1
        if verdict == "better":
            self.better += 1
            self.streak = 0
        else:
            self.streak += 1


@dataclass
class RoundPlan:
    round: int
    baseline_hash: str
    directions: list[dict[str, Any]]
    proposals: list[Proposal]
    rejected: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "baseline_hash": self.baseline_hash, "directions": self.directions,
                "proposals": [p.model_dump(mode="json") for p in self.proposals], "rejected": self.rejected,
                "sessions": self.sessions, "note": self.note}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RoundPlan":
        return cls(round=int(d["round"]), baseline_hash=d["baseline_hash"], directions=d.get("directions", []),
                   proposals=[Proposal.model_validate(p) for p in d.get("proposals", [])],
                   rejected=d.get("rejected", []), sessions=d.get("sessions", []), note=d.get("note", ""))


def merge_plans(first: RoundPlan, more: RoundPlan) -> RoundPlan:
    """One round's plan after it opened more directions (``more``) because ``first``'s gave no experiment: every
    direction, session and refusal stays on record; the proposals are the later plan's."""
    note = "; ".join(n for n in (first.note, more.note) if n)
    return RoundPlan(round=first.round, baseline_hash=first.baseline_hash,
                     directions=[*first.directions, *more.directions], proposals=list(more.proposals),
                     rejected=[*first.rejected, *more.rejected], sessions=[*first.sessions, *more.sessions], note=note)


def choose_directions(hypotheses: list[dict[str, Any]], stats: dict[str, DirectionStat], n: int, *,
                      exhausted_after: int = 2, gpus: int = 1, exclude: frozenset[str] = frozenset()
                      ) -> list[dict[str, Any]]:
    """The ``n`` directions this round investigates, each with its question and why it was chosen. ``exclude``:
    directions this round already opened (a round whose first directions gave nothing opens the next ones; it
    never falls back to exhausted directions then)."""
    best: dict[str, dict[str, Any]] = {}
    for h in sorted(hypotheses, key=lambda h: -float(h.get("score") or 0)):
        best.setdefault(h.get("direction"), h)
    rows = []
    for d in DIRECTIONS:
        if d in exclude:
            continue
        st = stats.get(d, DirectionStat())
        h = best.get(d)
        score = float(h.get("score") or 0) if h else 0.0
        bonus = EXPLORE_BONUS if st.tried == 0 else 0.0
        exhausted = st.streak >= exhausted_after
        rows.append({"direction": d, "score": round(score + bonus - (1.0 if exhausted else 0.0), 4),
                     "hypothesis": h.get("bottleneck") if h else None, "exhausted": exhausted,
                     "why": (f"{h['bottleneck']} scores {score:.2f}" if h else "no hypothesis of this direction")
                            + (" (not tried yet)" if bonus else "")
                            + (f"; set aside: its last {st.streak} experiments gained nothing" if exhausted else "")})
    rows.sort(key=lambda r: (-r["score"], r["direction"]))
    open_rows = [r for r in rows if not r["exhausted"]] or ([] if exclude else rows)
    out = []
    for r in open_rows[:n]:
        h = best.get(r["direction"])
        name = DIRECTION_NAMES[r["direction"]]
        if h:
            ev = "; ".join((h.get("evidence") or [])[:2]) or "no evidence line"
            q = (f"Which {name} change relieves {h['bottleneck']} ({h.get('summary') or ''}; evidence: {ev}) "
                 "and raises capacity at the SLA, by how much, and what would show it does not?")
        else:
            q = f"Is there a {name} change that raises capacity at the SLA although the diagnosis does not point here?"
        out.append({**r, "question": q})
    return out


def _save_trace(session: Session, trace_dir: Path | None, round_no: int) -> str | None:
    if trace_dir is None:
        return None
    path = Path(trace_dir) / f"round-{round_no:03d}" / f"{session.proposer}-{session.direction}.json"
    write_json(path, json_safe({"proposer": session.proposer, "direction": session.direction, "error": session.error,
                                "proposals": [p.id for p in session.proposals], "trace": session.trace}))
    return str(path)


def _save_orchestrator_trace(proposals: list[Proposal], trace_dir: Path | None, round_no: int) -> str | None:
    """The orchestrator's own proposals of a round (controls, combinations, the joint candidate) with what they
    were built from: parents, evidence, the surrogate's prediction; their ``trace`` points here."""
    if trace_dir is None or not proposals:
        return None
    path = Path(trace_dir) / f"round-{round_no:03d}" / "orchestrator.json"
    write_json(path, json_safe({"proposer": "orchestrator", "proposals": [
        {"id": p.id, "source": p.source, "kind": p.kind, "direction": p.direction, "parents": p.parent_ids,
         "intervention": p.intervention.delta(), "explanation": p.explanation, "evidence": p.evidence,
         "justification": p.intervention.justification, "prediction": p.prediction.model_dump()}
        for p in proposals]}))
    return str(path)


def _run_session(proposer: Any, brief: ResearchBrief, tools: Any) -> Session:
    try:
        return proposer.propose(brief, tools)
    except Exception as e:  # noqa: BLE001 -- one failed session must not stop the round
        return Session(proposer=getattr(proposer, "name", type(proposer).__name__), direction=brief.direction,
                       error=f"{type(e).__name__}: {e}"[:500])


@dataclass
class RoundInputs:
    """What the orchestrator knows when it plans a round (assembled by the campaign)."""
    brief: ResearchBrief  # the common brief; direction and question are filled per session
    stats: dict[str, DirectionStat]
    tested: dict[str, str]  # candidate config hash -> why it is not tested again
    gate_failures: dict[str, list[str]]  # experiment id -> the lossy settings (knob=value) it failed the gate with
    last_promotion: dict[str, Any] | None = None  # {"experiment_id", "delta", "previous_config", "ablated"}
    diversity_pool: list[dict[str, Any]] = field(default_factory=list)  # {"delta", "direction", "ratio", "id"}


def _made(kind: str, pid: str, brief: ResearchBrief, base: dict[str, Any], config: dict[str, Any], pred: dict[str, Any],
          predictor: Predictor, *, direction: str, explanation: str, falsification: str, parents: list[str],
          evidence: list[str], justification: str = "", source: str | None = None) -> Proposal:
    delta = diff(base, config)
    return Proposal(id=pid, endpoint=brief.endpoint, campaign_id=brief.campaign_id, round=brief.round,
                    proposer="orchestrator", source=source or kind, direction=direction,
                    kind="control" if kind == "control" else ("combination" if kind == "combination" else "follow_up"),
                    question=f"{kind}: {explanation[:160]}", explanation=explanation, evidence=evidence,
                    intervention=Intervention(changes=[KnobChange(knob=k, value=v) for k, v in delta.items()],
                                              justification=justification),
                    prediction=predictor.prediction(pred), falsification=falsification, parent_ids=parents)


def plan_round(inputs: RoundInputs, proposers: list[Any], *, guardrails: Guardrails, predictor: Predictor | None,
               max_experiments: int, n_directions: int, tools: Any = None, trace_dir: str | Path | None = None,
               exhausted_after: int = 2, exclude: frozenset[str] = frozenset()) -> RoundPlan:
    """One round's experiments: directions, sessions in parallel, guardrails, controls, selection. ``exclude``:
    directions not to open (``choose_directions``)."""
    brief0 = inputs.brief
    base, resolved = dict(brief0.baseline_config), dict(brief0.resolved_baseline)
    margin = float(brief0.noise.get("margin") or 0.02)
    directions = choose_directions(brief0.hypotheses, inputs.stats, n_directions, exhausted_after=exhausted_after,
                                   gpus=brief0.gpus, exclude=exclude)
    jobs = [(p, brief0.model_copy(update={"direction": d["direction"], "question": d["question"]}))
            for d in directions for p in proposers]
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as ex:
        sessions = list(ex.map(lambda j: _run_session(j[0], j[1], tools), jobs))
    session_rows = []
    candidates: list[Proposal] = []
    for s in sessions:
        path = _save_trace(s, Path(trace_dir) if trace_dir else None, brief0.round)
        s.trace_path = path
        session_rows.append({"proposer": s.proposer, "direction": s.direction, "proposals": [p.id for p in s.proposals],
                             "error": s.error, "trace": path})
        for p in s.proposals:
            candidates.append(p.model_copy(update={"trace": path}))

    rejected: list[dict[str, Any]] = []
    accepted: list[Proposal] = []
    seen: set[str] = set()

    def admit(p: Proposal) -> None:
        res = check(p, base, resolved, guardrails)
        reasons = list(res.reasons)
        if res.accepted:
            h = config_hash(res.candidate_config)
            if h in inputs.tested:
                reasons.append(f"already tested: {inputs.tested[h]}")
            elif h in seen and not p.is_patch:
                reasons.append("same candidate config as an earlier proposal of this round")
            failed = fails_gate(res.candidate_config, base, list(inputs.gate_failures.values()))
            if failed:
                exp = next(e for e, f in inputs.gate_failures.items() if f == failed)
                reasons.append(f"{', '.join(failed)} failed the correctness gate in {exp}")
            elif too_much := stakes_too_much(res.candidate_config, base):
                reasons.append(too_much)
        if reasons:
            rejected.append({"proposal_id": p.id, "proposer": p.proposer, "direction": p.direction, "kind": p.kind,
                             "parents": p.parent_ids, "intervention": p.intervention.delta(), "reasons": reasons})
            return
        seen.add(config_hash(res.candidate_config))
        accepted.append(p.model_copy(update={"candidate_config": res.candidate_config,
                                             "guardrail_notes": res.notes}))

    for p in candidates:
        admit(p)

    extra: list[Proposal] = []
    if predictor is not None:
        extra = _orchestrator_proposals(inputs, accepted, predictor, base, resolved, margin, guardrails.max_changes,
                                        sessions=sessions)
        path = _save_orchestrator_trace(extra, Path(trace_dir) if trace_dir else None, brief0.round)
        extra = [p.model_copy(update={"trace": path}) for p in extra]
        for p in extra:
            admit(p)

    def predicted(p: Proposal) -> float:
        return p.prediction.capacity_ratio

    supported = [p for p in accepted if p.kind == "control" or p.is_patch or p.source == MEASURED
                 or p.source.startswith("explore") or predicted(p) >= 1 + margin / 2]
    for p in accepted:
        if p not in supported:
            rejected.append({"proposal_id": p.id, "proposer": p.proposer, "direction": p.direction, "kind": p.kind,
                             "parents": p.parent_ids, "intervention": p.intervention.delta(),
                             "reasons": [f"predicted gain {predicted(p) - 1:+.1%} is below half the verdict margin "
                                         f"({margin:.1%}): not evidence-supported"]})
    order: list[Proposal] = [p for p in supported if p.kind == "control"][:1]
    combos = sorted((p for p in supported if p.kind == "combination" and p.source != FACTORIAL),
                    key=lambda p: -predicted(p))
    singles = [predicted(p) for p in supported if p.kind == "experiment"]
    if combos and (not singles or predicted(combos[0]) > max(singles)):
        order.append(combos[0])  # the best idea first; its singles below are its controls
    bests = []
    for d in [x["direction"] for x in directions]:
        mine = sorted((p for p in supported if p.direction == d and p.kind == "experiment"), key=lambda p: -predicted(p))
        if mine:
            bests.append(mine[0])
    order += sorted(bests, key=lambda p: -predicted(p))  # more directions than slots: the model's best bets
    rest = sorted((p for p in supported if p not in order and p.kind != "control"), key=lambda p: -predicted(p))

    def redundant(p: Proposal) -> bool:  # the same idea with a knob more or less than one already chosen
        mine = set(p.intervention.delta())
        return any(q.direction == p.direction and (mine <= set(q.intervention.delta()) or set(q.intervention.delta())
                                                   <= mine) for q in order)

    # by predicted gain, then the factorial pair, then variants of chosen ideas (a stable sort keeps the gain order)
    rest.sort(key=lambda p: 1 if p.source == FACTORIAL else (2 if redundant(p) else 0))
    chosen: list[Proposal] = []
    staked: set[str] = set()
    for p in order + rest:  # one candidate per new lossy setting a round: a failed gate fails them all
        risk = set(new_lossy(p.candidate_config or {}, base))
        if len(chosen) < max_experiments and not risk & staked:
            chosen.append(p)
            staked |= risk
    note = (f"{len(chosen)} experiment(s) from {len(candidates)} session proposal(s) and {len(extra)} of the "
            f"orchestrator; {len(rejected)} refused")
    return RoundPlan(round=brief0.round, baseline_hash=brief0.baseline_hash, directions=directions, proposals=chosen,
                     rejected=rejected, sessions=session_rows, note=note)


def _ideas(sessions: list[Session], accepted: list[Proposal], base: dict[str, Any],
           floor: float) -> list[tuple[float, dict[str, Any], str, str]]:
    """Every knob change the sessions scored at ``floor`` or better, best first, one per distinct change:
    (predicted ratio, delta, where it came from, direction)."""
    out: dict[str, tuple[float, dict[str, Any], str, str]] = {}
    for p in accepted:
        if p.kind == "experiment" and not p.is_patch and p.prediction.capacity_ratio >= floor:
            out[config_hash(p.intervention.delta())] = (p.prediction.capacity_ratio, p.intervention.delta(), p.id,
                                                        p.direction)
    for s in sessions:
        for t in (s.trace or {}).get("trials") or []:
            if t.get("value") is None or t["value"] < floor or t.get("source") == "history":
                continue
            delta = diff(base, t.get("config") or {})
            key = config_hash(delta)
            if delta and (key not in out or out[key][0] < t["value"]):
                source = out[key][2] if key in out else f"trace:{s.direction}:{key[:6]}"  # a proposal keeps its id
                out[key] = (float(t["value"]), delta, source, s.direction)
    return sorted(out.values(), key=lambda x: -x[0])


def joint_candidate(ideas: list[tuple[float, dict[str, Any], str, str]], predictor: Predictor, base: dict[str, Any],
                    resolved: dict[str, Any], margin: float, max_changes: int, gpus: int, *,
                    gate_failures: list[list[str]] = (), max_ideas: int = 8
                    ) -> tuple[dict[str, Any], dict[str, Any], list[str], list[str]] | None:
    """Forward selection over the ideas (see the module docstring): (config, prediction, parents, directions)
    of the best combination of two or more, or None."""
    if len(ideas) < 2:
        return None
    value, delta, src, direction = ideas[0]
    current, parents, dirs, pred = dict(delta), [src], [direction], None
    for v, d, s, dr in ideas[1:max_ideas]:
        if set(d) & set(current) or len(set(d) | set(current)) > max_changes:
            continue
        cfg = normalize({**base, **current, **d}, base, resolved)
        if static_problem(cfg, gpus) or fails_gate(cfg, base, list(gate_failures)) or stakes_too_much(cfg, base):
            continue  # two ideas may each pass alone and together repeat (or pile up) lossy settings
        p = predictor.predict(base, [cfg])[0]
        if p.get("feasible") and p["ratio"] > value * (1 + margin / 4):
            current, value, pred = {**current, **d}, p["ratio"], p
            parents.append(s)
            dirs.append(dr)
    if pred is None:
        return None
    return normalize({**base, **current}, base, resolved), pred, parents, dirs


def control_groups(delta: dict[str, Any]) -> dict[str, list[str]]:
    """The units a promoted change is ablated in: its knobs grouped by direction (a technique's parameters,
    e.g. EAGLE's draft tokens, mean nothing reverted without the rest of it). A change of one group needs no
    control: its own experiment compared it with the baseline."""
    out: dict[str, list[str]] = {}
    for k in delta:
        table = next((t for t in KNOBS_BY_ENGINE.values() if k in t), None)
        out.setdefault(table[k].direction if table else "other", []).append(k)
    return out


def _orchestrator_proposals(inputs: RoundInputs, accepted: list[Proposal], predictor: Predictor,
                            base: dict[str, Any], resolved: dict[str, Any], margin: float,
                            max_changes: int, *, sessions: list[Session] = ()) -> list[Proposal]:
    brief = inputs.brief
    todo: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []  # (kind, id, config, meta)
    promo = inputs.last_promotion
    groups = control_groups(promo.get("delta") or {}) if promo else {}
    if promo and not promo.get("ablated") and len(groups) > 1:
        prev = promo.get("previous_config") or {}
        for group, knobs in groups.items():
            if group in (promo.get("attribution") or {}):
                continue  # this part's control already ran
            cfg = normalize({**base, **{k: prev.get(k) for k in knobs}}, base, resolved)
            todo.append(("control", f"r{brief.round}-control-{group}", cfg,
                         {"knob": ", ".join(knobs), "parents": [promo.get("experiment_id") or "promotion"]}))
    for i, entry in enumerate(inputs.diversity_pool):
        cfg = normalize({**base, **(entry.get("delta") or {})}, base, resolved)
        if config_hash(cfg) != config_hash(base) and not static_problem(cfg, brief.gpus):
            todo.append(("follow_up", f"r{brief.round}-follow-{i}-{config_hash(cfg)[:6]}", cfg, entry))
    best: dict[str, Proposal] = {}
    for p in sorted(accepted, key=lambda p: -p.prediction.capacity_ratio):
        if p.kind == "experiment" and not p.is_patch and p.prediction.capacity_ratio >= 1 + margin:
            best.setdefault(p.direction, p)
    tops = list(best.values())
    for size in range(2, len(tops) + 1):
        for group in itertools.combinations(tops, size):
            deltas = [diff(base, p.candidate_config) for p in group]
            knobs = [k for d in deltas for k in d]
            if len(knobs) != len(set(knobs)) or len(knobs) > max_changes:
                continue
            cfg = normalize({**base, **{k: v for d in deltas for k, v in d.items()}}, base, resolved)
            if not static_problem(cfg, brief.gpus) and not stakes_too_much(cfg, base):
                todo.append(("combination", f"r{brief.round}-combo-{config_hash(cfg)[:6]}", cfg,
                             {"parents": [p.id for p in group], "directions": [p.direction for p in group],
                              "best_single": max(p.prediction.capacity_ratio for p in group)}))
    preds = predictor.predict(base, [c for _, _, c, _ in todo]) if todo else []
    # the diversity pool's changes, measured good before, are ideas too: a joint candidate can add them up
    follow_ideas = [(pred["ratio"], diff(base, cfg), pid, meta.get("direction") or "control")
                    for (kind, pid, cfg, meta), pred in zip(todo, preds)
                    if kind == "follow_up" and pred.get("feasible") and pred["ratio"] >= 1 + margin / 2]
    ideas = sorted(_ideas(list(sessions), accepted, base, 1 + margin / 2) + follow_ideas, key=lambda x: -x[0])
    joint = joint_candidate(ideas, predictor, base, resolved, margin, max_changes, brief.gpus,
                            gate_failures=list(inputs.gate_failures.values()))
    out = []
    if joint is not None and all(config_hash(c) != config_hash(joint[0]) for _, _, c, _ in todo):
        cfg, pred, parents, dirs = joint
        delta = diff(base, cfg)
        out.append(_made("combination", f"r{brief.round}-joint-{config_hash(cfg)[:6]}", brief, base, cfg, pred,
                         predictor, direction=dirs[0], parents=parents,
                         explanation=(f"joint candidate: forward selection over every change the sessions scored "
                                      f"adds {', '.join(delta)} together (from {', '.join(parents)}; directions "
                                      f"{', '.join(dict.fromkeys(dirs))}), each addition raising the predicted "
                                      "ratio by more than a quarter of the verdict margin"),
                         falsification=("refuted if it is not better, or not better than its best single in this "
                                        "round: the changes do not add up on the real engine"),
                         evidence=[f"best single idea ({ideas[0][2]}) predicted {ideas[0][0]:.3f}x; the joint "
                                   f"change {pred['ratio']:.3f}x"], source="joint",
                         justification=(f"the surrogate predicts {pred['raw_ratio']:.3f}x for the joint change; its "
                                        "steps come from the sessions' searches within the justified step")))
    factorial = False
    for (kind, pid, cfg, meta), pred in zip(todo, preds):
        if not pred.get("feasible"):
            continue
        source = None
        if kind == "combination" and pred["ratio"] <= meta["best_single"] * (1 + margin / 4):
            if factorial or len(meta["parents"]) != 2 or pred["ratio"] < 1 + margin:
                continue  # the model sees no added gain: its best single says as much for one experiment less
            # but the two best directions' pair is run where a slot is free (a 2x2 design with its singles):
            # whether two gains add up is what the surrogate knows least
            factorial, source = True, FACTORIAL
        delta = diff(base, cfg)
        if kind == "control":
            out.append(_made(kind, pid, brief, base, cfg, pred, predictor, direction="control", parents=meta["parents"],
                             justification=("a control reverts one knob of a promoted change to its earlier value; "
                                            "the size of that step was justified by the promotion's own verdict"),
                             explanation=(f"control after the promotion of {meta['parents'][0]}: revert "
                                          f"{meta['knob']} alone to its earlier value to check that this earlier "
                                          "choice still pays in the combination"),
                             falsification=(f"the choice of {meta['knob']} still pays if this candidate is worse; "
                                            "if it is same or better the knob carries no gain in the combination"),
                             evidence=[f"promoted change: {json.dumps(promo.get('delta'), sort_keys=True, default=str)}"]))
        elif kind == "follow_up":
            measured = meta.get("verdict") == "better"
            out.append(_made(kind, pid, brief, base, cfg, pred, predictor, direction=meta.get("direction") or "control",
                             parents=[meta.get("id", "")], source=MEASURED if measured else None,
                             explanation=(f"follow-up from the diversity pool: {json.dumps(meta.get('delta'), default=str)} "
                                          f"measured {meta.get('ratio', 0):.3f}x against an earlier baseline; "
                                          "re-applied on the new baseline to see whether its gain adds up"),
                             falsification="refuted if the candidate is not better: the earlier gain does not add to "
                                           "the promoted change (they compete for the same resource)",
                             evidence=[f"earlier verdict {meta.get('verdict')} at ratio {meta.get('ratio', 0):.3f}"],
                             justification=(f"this change measured {meta.get('ratio', 0):.3f}x in experiment "
                                            f"{meta.get('id', '?')}: its steps are backed by a verdict")))
        else:
            parts = " and ".join(f"{p} ({d})" for p, d in zip(meta["parents"], meta["directions"]))
            out.append(_made(kind, pid, brief, base, cfg, pred, predictor, direction=meta["directions"][0],
                             parents=meta["parents"], source=source,
                             explanation=(f"combination of {parts}: disjoint knobs {', '.join(delta)} whose gains "
                                          "may add up, each relieving its own bottleneck; the singles in this round "
                                          "are its controls"),
                             falsification="refuted if the combination is not better than the best single: the "
                                           "changes relieve the same bottleneck",
                             evidence=[f"singles predicted {', '.join(p for p in meta['parents'])}"],
                             justification=(f"the surrogate predicts {pred['raw_ratio']:.3f}x for the combination; "
                                            "each step was justified by its parent's own search")))
    return out


def summarize_plan(plan: RoundPlan) -> list[dict[str, Any]]:
    """A row per chosen proposal (what the UI table and the CLI show)."""
    return [{"id": p.id, "proposer": p.proposer, "direction": p.direction, "kind": p.kind,
             "intervention": p.intervention.delta(), "predicted": p.prediction.capacity_ratio,
             "interval": [p.prediction.ratio_low, p.prediction.ratio_high], "trace": p.trace}
            for p in plan.proposals]


EXPLOIT = "explore:exploit"  # an "explore" source: its case is the calibrated interval (exempt from the pre-screen)


def exploit_proposals(inputs: RoundInputs, predictor: Predictor, guardrails: Guardrails, *, max_proposals: int = 1,
                      singles: int = 24, seed: int = 0) -> tuple[list[Proposal], str]:
    """What a round proposes when its directions gave nothing while budget is left: the calibrated surrogate's
    best configs over the whole space around the baseline, ranked by the upper bound of their interval.

    Single-knob moves of every knob the guardrails allow (a seeded sample of at most ``singles``, each value
    within the justified step of the resolved baseline) are predicted; forward selection (``joint_candidate``,
    on the upper bounds) combines the disjoint ones whose bound grows. A candidate already tested, repeating a
    failed correctness gate, staking two new lossy settings or refused by the guardrails is left out. The best
    ``max_proposals`` whose upper bound reaches ``1 + margin`` (a gain the verdict could confirm is inside the
    interval) become four-part proposals; none reaching it is the stated reason the campaign may end
    (returned as the note)."""
    import random

    brief = inputs.brief
    base, resolved = dict(brief.baseline_config), dict(brief.resolved_baseline)
    margin = float(brief.noise.get("margin") or 0.02)
    floor = 1 + margin
    table = knobs_for(brief.engine)
    space = SearchSpace.full(brief.gpus, base, brief.engine).around(None, resolved,
                                                                    max_step=guardrails.justified_step)
    gates = list(inputs.gate_failures.values())
    moves: list[dict[str, Any]] = []
    seen = {config_hash(base)}
    for knob, vals in sorted(space.choices.items()):
        if knob in guardrails.locked:
            continue
        for v in vals:
            cfg = normalize({**base, knob: v}, base, resolved, brief.engine)
            h = config_hash(cfg)
            if h in seen or static_problem(cfg, brief.gpus, brief.engine) or fails_gate(cfg, base, gates) \
                    or stakes_too_much(cfg, base):
                continue
            seen.add(h)
            moves.append(cfg)
    rng = random.Random(seed * 7919 + brief.round)
    if len(moves) > singles:
        moves = rng.sample(moves, singles)
    preds = predictor.predict(base, moves) if moves else []
    scored: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
    for cfg, p in zip(moves, preds):
        if p.get("feasible") and p.get("high") is not None:
            scored.append((float(p["high"]), cfg, p))
    scored.sort(key=lambda x: -x[0])

    def direction_of(delta: dict[str, Any]) -> str:
        for k in delta:
            if k in table and table[k].direction in DIRECTIONS:
                return table[k].direction
        return "scheduling_cache"

    class _Upper:  # the predictor seen through its upper bounds: forward selection on the optimistic value
        def predict(self, b: dict[str, Any], cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [({**p, "ratio": p["high"]} if p.get("feasible") else p) for p in predictor.predict(b, cfgs)]

    ideas = [(hi, diff(base, cfg), f"single:{config_hash(cfg)[:6]}", direction_of(diff(base, cfg)))
             for hi, cfg, _ in scored if hi >= 1 + margin / 2]
    pool = list(scored)
    joint = joint_candidate(ideas, _Upper(), base, resolved, margin, guardrails.max_changes, brief.gpus,
                            gate_failures=gates)
    if joint is not None:
        jp = predictor.predict(base, [joint[0]])[0]
        if jp.get("feasible"):
            pool.insert(0, (float(jp["high"]), joint[0], jp))
    pool.sort(key=lambda x: -x[0])
    out: list[Proposal] = []
    best_hi = pool[0][0] if pool else None
    for hi, cfg, p in pool:
        if len(out) >= max_proposals or hi < floor:
            break
        res = check(Proposal(id="probe", endpoint=brief.endpoint, proposer="orchestrator", source=EXPLOIT,
                             direction=direction_of(diff(base, cfg)), explanation="guardrail probe of a candidate",
                             intervention=Intervention(changes=[KnobChange(knob=k, value=v)
                                                                for k, v in diff(base, cfg).items()],
                                                       justification="the calibrated surrogate's upper bound"),
                             prediction=predictor.prediction(p), falsification="probe only, never run"),
                    base, resolved, guardrails)
        if not res.accepted or config_hash(res.candidate_config) in inputs.tested:
            continue
        delta = diff(base, cfg)
        pid = f"r{brief.round}-exploit-{len(out)}-{config_hash(cfg)[:6]}"
        prop = _made("follow_up", pid, brief, base, cfg, p, predictor, direction=direction_of(delta), parents=[],
                     source=EXPLOIT,
                     explanation=(f"exploitation with budget left: no direction's session gave an evidence-supported "
                                  f"experiment, but the calibrated surrogate's best config around the baseline "
                                  f"({', '.join(f'{k}={v!r}' for k, v in delta.items())}) predicts {p['ratio']:.3f}x "
                                  f"with an upper bound of {hi:.3f}x, above the verdict margin {floor:.3f}: only a "
                                  "measurement can rule it out"),
                     falsification=(f"refuted if the verdict is not better or the measured ratio falls outside "
                                    f"[{p['low']:.3f}, {p['high']:.3f}]; a refutation shrinks what the surrogate's "
                                    "interval may claim for these knobs"),
                     evidence=[f"surrogate point {p['ratio']:.3f}x, interval [{p['low']:.3f}, {p['high']:.3f}] "
                               f"(basis: {p.get('basis', '')[:160]})",
                               f"{len(scored)} single-knob moves predicted; joint candidate "
                               + ("found" if joint is not None else "none")],
                     justification=(f"the calibrated surrogate predicts {p['raw_ratio']:.3f}x (uncorrected); the "
                                    "steps stay within the guardrails' justified step"))
        out.append(prop.model_copy(update={"candidate_config": res.candidate_config, "guardrail_notes": res.notes}))
    if out:
        note = (f"exploitation: {len(out)} surrogate candidate(s) whose upper bound reaches the verdict margin "
                f"({floor:.3f})")
    elif best_hi is None:
        note = "exploitation: no untested feasible move around the baseline"
    else:
        note = (f"exploitation: the best optimistic bound of {len(pool)} surrogate candidate(s) is {best_hi:.3f}x, "
                f"below the verdict margin {floor:.3f} (or every such candidate was tested or refused)")
    return out, note
