"""Owns the campaign loop: measure the working baseline, diagnose it, plan a round, run the round's
experiments through the shared harness, close the round (score, remember, promote, spend), repeat,
and finish with the best confirmed config and a review package.

Every step is a method of ``CampaignRunner`` that loads nothing but the saved state and writes it
back atomically, so the same steps serve the CLI (``run`` drives them in one process), the Dagster
assets (one step per asset, the back edges owned by sensors) and the benchmarks:

- ``measure``: the era's noise floor (``experiments.noise``); its runs become the era's shared control;
  the surrogate (starting from the endpoint's latest stored calibration) is calibrated on them and the
  fit stored as the next version (``campaign.grounding``); a promotion's re-measured gain is checked
  (replication);
- ``diagnose``: the diagnostic report (or one the caller measured) and its hypotheses;
- ``plan``: the orchestrator's round (``agents.orchestrator``) within the budget left, pre-screened on the
  calibrated emulator when ``prescreen`` is set (``agents.prescreen``);
- ``run_proposal``: one experiment against the shared control (parallel-safe: it writes only its file);
- ``close``: scores, memory, direction statistics, the diversity pool, the corrector's residuals, the
  emulator's prediction beside each measurement (``emulator_errors``; a drifting error re-calibrates)
  and the promotion decision, then what comes next (promote, another round, or the end);
- ``set_baseline``: a promotion (or a rollback) becomes the next era;
- ``finish``: ``campaign.json``, the progress plot and the review package (``campaign.review``).

Between promotions the baseline is unchanged, so rounds repeat without re-measuring noise or
re-diagnosing. A failed correctness gate is a verdict (invalid: correctness) and the loop goes on.
"""
from __future__ import annotations

import math

import datetime as dt
import hashlib
import json
import logging
import statistics
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from autoresearch_dagster.agents import emulator_errors, scoring
from autoresearch_dagster.agents.guardrails import Guardrails, resolved_config
from autoresearch_dagster.agents.offline import OfflineProposer, Predictor, diff
from autoresearch_dagster.agents.orchestrator import (DirectionStat, RoundInputs, RoundPlan, control_groups,
                                                      exploit_proposals, merge_plans, plan_round)
from autoresearch_dagster.agents.prescreen import prescreen
from autoresearch_dagster.agents.search import normalize
from autoresearch_dagster.agents.proposal import Intervention, KnobChange, Proposal, ResearchBrief, lossy_settings
from autoresearch_dagster.agents.surrogate import Corrector, Surrogate
from autoresearch_dagster.agents.tools import ToolBox
from autoresearch_dagster.campaign import drafter_step, grounding
from autoresearch_dagster.campaign.state import CampaignSettings, CampaignState, Era, same_version
from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.emulator.engine_profiles import ENGINE_OF
from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.experiments import stats
from autoresearch_dagster.experiments.campaign import Campaign, campaign_id, identity, record_promotion, start_campaign
from autoresearch_dagster.experiments.experiment import SharedControl, run_experiment
from autoresearch_dagster.experiments.parallel import max_workers
from autoresearch_dagster.experiments.runs import HarnessSettings, RunRecord
from autoresearch_dagster.measure.profiles import MeasurementProfile, measurement_profile
from autoresearch_dagster.memory import (Conditions, Memory, MemoryVersionError, finding_rows, model_family, outcome,
                                         technique)
from autoresearch_dagster.outputs.files import json_safe, write_json
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import Budget, EndpointSpec, SpecError, config_hash, is_lossy, knobs_for

Say = Callable[[str], None]
log = logging.getLogger(__name__)


def _now() -> str:
    return utc_now().isoformat()


ARCHIVED = ("state.json", "eras", "rounds", "traces", "surrogate_cache.json", "gpu_savings.json", "campaign.json",
            "campaign_progress.png", "review")  # what a campaign writes in its directory (archived, not deleted)
ABLATED_DIRECTIONS = ("scheduling_cache", "kernels_quant", "parallel_admission")  # speculative knobs are one technique


def reported_version(engine: Any) -> str:
    """The version the engine reports now (``Engine.version``); 'unknown' when it cannot say."""
    try:
        return str(engine.version() or "unknown")
    except Exception:  # an engine that cannot say (not installed, not answering) is not a changed one
        return "unknown"


def gate_key(baseline: dict[str, Any], candidate: dict[str, Any], engine: str = "sglang") -> str:
    """What the correctness gate's answer depends on: the numerics of both configs (the engine's knobs)."""
    table = knobs_for(engine)

    def numerics(c: dict[str, Any]) -> str:
        return ",".join(f"{k}={table[k].canonical(c.get(k, table[k].default))}" for k in table
                        if any(table[k].meaning(v).lossy for v in list(table[k].meanings)))
    return f"{numerics(baseline)}|{numerics(candidate)}"


class CampaignRunner:
    """One endpoint's campaign on one pool, SLA and correctness requirement (see the module docstring)."""

    def __init__(self, endpoint: EndpointSpec, pool: Any, *, engine: Any, out_dir: str | Path,
                 settings: CampaignSettings | None = None, measurement: str | MeasurementProfile = "standard",
                 results: Any = None, memory: Memory | None = None, say: Say | None = None,
                 proposers: list[Any] | None = None, fresh: bool = False, origin: str | None = None):
        """``fresh``: start anew even when ``out_dir`` holds a campaign; ``origin``: what started this campaign
        (a seeding run). A saved state of another origin, of another campaign identity (a rebuilt pool, another
        SLA or correctness requirement), or an ended one whose engine now reports another version, is archived
        (``archive/<campaign id>.<time>/``: its state, eras, rounds, traces and review package, so no control run
        or experiment file of it is reused) and a new campaign starts: from the spec's config, or (``restart_from``
        "promoted", after a rebuilt pool or an engine bump) from the previous campaign's best confirmed config.
        A running campaign whose engine reports another version continues in an ``engine_bump`` era
        (``engine_bump``); otherwise the saved state resumes."""
        self.endpoint, self.pool, self.engine, self.results = endpoint, pool, engine, results
        self.settings = settings or CampaignSettings()
        self.profile = measurement_profile(measurement) if isinstance(measurement, str) else measurement
        self.dir = Path(out_dir)
        self.memory = memory
        self.say = say or (lambda _m: None)
        self._proposers = proposers
        self.origin = origin
        self.engine_version = reported_version(engine)
        self.state_path = self.dir / "state.json"
        state = CampaignState.load(self.state_path) if self.state_path.exists() else None
        self._start_config, previous = dict(endpoint.server_config), None
        why = self._restart_reason(state, fresh=fresh, origin=origin) if state is not None else None
        if state is not None and why is not None:
            previous = self._archive(state, why)
            state = None
        if state is None and previous is not None and previous["carry_over"]:
            self._start_config = dict(previous["best_config"])
        self.campaign: Campaign = start_campaign(
            endpoint, pool, results=results, engine_name=getattr(engine, "name", endpoint.engine),
            engine_version=state.engine_version if state is not None else self.engine_version,
            baseline_config=self._start_config if state is None else None)
        self.state = state or self._new_state(previous)
        self.save()
        b = self.settings.budget
        self.workers = max(1, min(b.max_concurrent_gpus // max(1, endpoint.gpus), max_workers()))
        self._surrogate: Surrogate | None = None

    # ------------------------------------------------------------------ plumbing

    def _restart_reason(self, state: CampaignState, *, fresh: bool, origin: str | None) -> str | None:
        """Why the saved state does not continue (None: it resumes)."""
        if fresh:
            return "fresh start asked for"
        if origin is not None and state.origin != origin:
            return "re-seeded"
        pool_hash, sla, corr = identity(self.endpoint, self.pool)
        if state.pool_hash != pool_hash:
            return f"pool rebuilt: {state.pool_hash[:12]} -> {pool_hash[:12]}"
        if (state.sla, state.correctness_hash) != (sla, corr):
            return "SLA or correctness requirements changed"
        if state.campaign_id != campaign_id(self.endpoint, self.pool, engine_version=state.engine_version):
            return "another campaign identity"
        ran_on = state.era.engine_version or state.engine_version
        if state.status == "ended" and not same_version(ran_on, self.engine_version):
            return f"engine_bump: {ran_on} -> {self.engine_version} after the campaign ended"
        return None

    def _archive(self, state: CampaignState, why: str) -> dict[str, Any]:
        """Move the old campaign's files under ``archive/`` (nothing is deleted, nothing of it is reused)."""
        from autoresearch_dagster.campaign.report import best_era

        dest = self.dir / "archive" / f"{state.campaign_id}.{dt.datetime.now().strftime('%Y%m%dT%H%M%S%f')}"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ARCHIVED:
            if (self.dir / name).exists():
                (self.dir / name).rename(dest / name)
        best = best_era(state)
        # a changed engine or pool (not a re-seed, a fresh start or another SLA) carries the best config over, by
        # policy, when the spec's config is still the one the old campaign's line started from
        spec = (state.previous or {}).get("spec_config_hash") or config_hash(state.original.config)
        carry = (self.settings.restart_from == "promoted" and why.startswith(("engine_bump", "pool rebuilt"))
                 and spec == config_hash(self.endpoint.server_config) and best.index != state.original.index)
        self.say(f"campaign {state.campaign_id} archived in {dest} ({why})"
                 + (f"; the new campaign starts from its best config {best.config_hash}" if carry else ""))
        return {"campaign_id": state.campaign_id, "why": why, "archive": str(dest), "status": state.status,
                "engine_version": state.era.engine_version or state.engine_version, "pool_hash": state.pool_hash,
                "best_config": best.config, "best_config_hash": best.config_hash, "carry_over": carry}

    def _new_state(self, previous: dict[str, Any] | None = None) -> CampaignState:
        c = self.campaign
        config = dict(self._start_config)
        era = Era(index=0, config=config, config_hash=config_hash(config), reason="original", set_at=_now(),
                  engine_version=self.engine_version)
        return CampaignState(campaign_id=c.campaign_id, endpoint=self.endpoint.name, created_at=_now(), origin=self.origin,
                             settings=self.settings.model_dump(mode="json"), pool_hash=c.pool_hash, sla=c.sla,
                             correctness_hash=c.correctness_hash, engine=c.engine, gpus=self.endpoint.gpus, eras=[era],
                             engine_version=self.engine_version,
                             previous={**{k: v for k, v in previous.items() if k != "best_config"},
                                       "spec_config_hash": config_hash(self.endpoint.server_config)}
                             if previous else None)

    def observe_version(self, seen: str | None = None) -> str:
        """Re-read the version the engine reports (a runner that outlives an engine upgrade: the version was read
        when it started); ``seen``: a version a run reported, taken when the engine itself still says the old one
        or cannot say. Returns the version the campaign now compares its era against."""
        now = reported_version(self.engine)
        if seen not in (None, "", "unknown") and same_version(now, self.engine_version):
            now = str(seen)
        self.engine_version = now
        return now

    def engine_bump(self) -> Era | None:
        """A running campaign whose engine reports another version than its era was measured on opens an
        ``engine_bump`` era: the same config, its own noise floor (control runs), calibration and diagnosis, so
        runs of two versions are never pooled. A round planned on the old version is abandoned and the directions'
        statistics start again. Returns the new era (None: no bump)."""
        st = self.state
        era = st.era
        if not self.running or same_version(era.engine_version, self.engine_version):
            return None
        old = era.engine_version
        if era.noise is None:  # nothing was measured on the old version in this era: it is measured on the new one
            era.engine_version = self.engine_version
            self.save()
            return None
        new = Era(index=era.index + 1, config=dict(era.config), config_hash=era.config_hash, reason="engine_bump",
                  set_at=_now(), previous_config=dict(era.config), engine_version=self.engine_version)
        st.eras.append(new)
        if st.rounds and st.rounds[-1].get("status") == "planned":
            st.rounds[-1].update(status="abandoned", note=(st.rounds[-1].get("note") or "") +
                                 f"; abandoned: engine {old} -> {self.engine_version}")
        st.decisions.append({"round": len(st.rounds), "era": new.index, "promote": False, "next": "measure",
                             "engine_bump": {"from": old, "to": self.engine_version}, "decided_at": _now(),
                             "reason": f"engine version {old} -> {self.engine_version}: a fresh baseline (era "
                                       f"{new.index}) with its own noise floor and diagnosis"})
        st.direction_stats = {}  # a direction spent on the old version is worth another look on the new one
        self._surrogate = None
        st.phase = "measure"
        self.save()
        self.say(f"engine {old} -> {self.engine_version}: era {new.index} re-measures {new.config_hash} on the new "
                 "version (its own control, noise floor and diagnosis)")
        return new

    def save(self) -> None:
        self.state.save(self.state_path)

    def harness(self) -> HarnessSettings:
        # capacity-only experiments: an autoscaled endpoint's GPUs saved are measured once, at the end (gpu_savings)
        return HarnessSettings(capacity=self.profile.capacity, seed=self.settings.seed, parallel_runs=self.workers,
                               confirm=self.settings.confirm == "fresh_runs", stop_when_not_better=True,
                               demand_replay=False)

    def experiment_harness(self, era: Era, proposal_id: str) -> HarnessSettings:
        """The harness of one experiment: seeds of its own (stable across a resume), so the fresh baseline
        anchors of the round's experiments are distinct runs, not the same seeds measured again."""
        salt = int(hashlib.sha256(f"{era.config_hash}:{proposal_id}".encode()).hexdigest()[:7], 16)
        return replace(self.harness(), seed=self.settings.seed * 1_000_003 + salt)

    def time_left(self) -> float | None:
        limit = self.settings.budget.max_wall_s
        if limit is None:
            return None
        started = dt.datetime.fromisoformat(self.state.created_at)
        return limit - (utc_now() - started).total_seconds()

    def experiment_gpu_seconds(self) -> float:
        """The most the next experiment may spend: both arms at twice the run cap (an undecided comparison's
        extension goes that far) at the era's noise-floor cost per run, or more where one of this campaign's
        experiments spent more."""
        noise = self.state.era.noise or {}
        per_run = float(noise.get("gpu_seconds") or 0.0) / max(1, int(noise.get("runs") or 1))
        spent = [float(e.get("gpu_seconds") or 0.0) for e in self.state.experiments if e.get("ran")]
        return max([2 * 2 * self.profile.max_runs_per_arm * per_run, *spent])

    def budget_problem(self, *, noise_cost: bool = False, experiment: bool = False,
                       pending_gpu_seconds: float = 0.0) -> str | None:
        """Why the campaign may not spend more (None: it may), checked before every step that measures:
        ``experiment``: before one starts, whose expected cost must fit what is left of the GPU-hour budget
        (``pending_gpu_seconds``: what the round's finished experiments spent, not yet counted)."""
        b, spent = self.settings.budget, self.state.spent
        left = self.time_left()
        if left is not None and left <= 0:
            return f"deadline: {b.max_wall_s:.0f} s since the campaign started"
        if b.max_experiments is not None and not noise_cost and spent["experiments"] >= b.max_experiments:
            return f"budget: {b.max_experiments} experiments"
        if b.max_gpu_hours is not None:
            used = spent["gpu_seconds"] + pending_gpu_seconds
            need = (self.state.era.noise or {}).get("gpu_seconds", 0.0) if noise_cost else 0.0
            if used + need >= b.max_gpu_hours * 3600:
                return f"budget: {b.max_gpu_hours:g} GPU-hours"
            cost = self.experiment_gpu_seconds() if experiment else 0.0
            if used + cost > b.max_gpu_hours * 3600:
                return (f"budget: {b.max_gpu_hours:g} GPU-hours (an experiment needs ~{cost / 3600:.3g}, "
                        f"{used / 3600:.3g} spent)")
        return None

    def _era_dir(self, era: Era | None = None) -> Path:
        return self.dir / "eras" / f"{(era or self.state.era).index:02d}"

    def control_runs(self, era: Era | None = None) -> list[RunRecord]:
        path = self._era_dir(era) / "control_runs.json"
        if not path.exists():
            return []
        return [RunRecord(**{k: v for k, v in d.items() if k in RunRecord.__dataclass_fields__})
                for d in json.loads(path.read_text())]

    def _add_control_runs(self, runs: list[RunRecord], version: str | None = None) -> None:
        """Add valid runs to the era's control; a run of another engine version than the era's noise floor
        (``version``: the one its runs reported) is never pooled with them."""
        ref = version or (self.state.era.noise or {}).get("engine_version")
        keep = self.control_runs() + [r for r in runs if r.valid and same_version(r.engine_version, ref)]
        write_json(self._era_dir() / "control_runs.json", json_safe([r.to_dict() for r in keep]))
        self.state.era.control_run_ids = [r.run_id for r in keep]

    def conditions(self) -> Conditions:
        from autoresearch_dagster.pool.workload import workload_stats

        if not hasattr(self, "_traits"):
            w = workload_stats(list(self.pool.iter_requests("serving")))
            self._traits = {"mean_prompt_tokens": float(w.prompt_tokens.get("mean") or 0.0),
                            "mean_output_tokens": float(w.output_tokens.get("mean") or 0.0),
                            "prefix_hit_rate": float(w.prefix_hit_rate),
                            "interarrival_cv": float(w.interarrival_cv or 0.0)}
        era = self.state.era
        version = (era.noise or {}).get("engine_version") or era.engine_version or (
            self.state.original.noise or {}).get("engine_version", "unknown")
        return Conditions(engine=self.state.engine, engine_version=str(version), model=self.endpoint.model,
                          gpu=self.endpoint.hardware.gpu, gpus=self.endpoint.gpus, pool_hash=self.state.pool_hash,
                          traits={k: v for k, v in self._traits.items() if v is not None})

    def profile_for_memory(self) -> dict[str, Any]:
        c = self.conditions()
        return {"model_family": c.model_family, "gpu": c.gpu, "traits": c.traits}

    # ------------------------------------------------------------------ the model

    def surrogate(self) -> Surrogate:
        if self._surrogate is None:
            if not self.state.surrogate.get("efficiency"):  # a new campaign starts from the stored calibration
                c = self.conditions()
                stored, version, passed = grounding.start_from_store(
                    self.results, self.endpoint.name, engine=c.engine, engine_version=c.engine_version,
                    model=c.model, gpu=c.gpu)
                for why in passed[:3]:
                    self.say(f"  stored calibration {why}: not started from")
                if len(passed) > 3:
                    self.say(f"  ... and {len(passed) - 3} older stored calibrations")
                if stored:
                    self.state.surrogate.update(efficiency=stored, version=version, start_version=version)
                else:  # no calibration of this endpoint yet: its engine release's profile is the prior
                    prof, why = grounding.start_from_profile(c.engine, c.engine_version, c.model, c.gpu)
                    if prof or c.engine in ENGINE_OF:
                        self.say(f"  engine profile: {why}")
                    if prof:
                        self.state.surrogate.update(efficiency=prof, profile=why)
            eff = self.state.surrogate.get("efficiency")
            base_cap = ((self.state.era.noise or {}).get("median") or 1.0)
            cap = self.profile.capacity
            from dataclasses import replace

            cap = replace(cap, start_rps=max(0.25, round(base_cap / 4, 3)))
            self._surrogate = Surrogate(self.endpoint, self.pool, capacity=cap,
                                        efficiency=Efficiency(**eff) if eff else None, seed=self.settings.seed,
                                        workers=self.workers)
            self._surrogate.calibration = self.state.surrogate.get("calibration")
            cache = self.dir / "surrogate_cache.json"
            if cache.exists():
                saved = json.loads(cache.read_text())
                if saved.get("model") == self._surrogate.model_id:
                    from autoresearch_dagster.agents.surrogate import SurrogatePoint

                    self._surrogate.cache = {h: SurrogatePoint(**p) for h, p in saved.get("points", {}).items()}
        return self._surrogate

    def _save_surrogate(self) -> None:
        if self._surrogate is not None:
            write_json(self.dir / "surrogate_cache.json",
                       json_safe({"model": self._surrogate.model_id,
                                  "points": {h: p.__dict__ for h, p in self._surrogate.cache.items()}}))

    def corrector(self) -> Corrector:
        cv = float((self.state.era.noise or {}).get("cv") or 0.03)
        c = Corrector(measurement_cv=cv)
        for r in self.state.residuals:
            c.add(r["knobs"], r["predicted"], r["measured"])
        return c

    def predictor(self) -> Predictor:
        return Predictor(self.surrogate(), self.corrector())

    def guardrails(self) -> Guardrails:
        return Guardrails.for_endpoint(self.endpoint)

    def proposers(self) -> list[Any]:
        if self._proposers is not None:
            return self._proposers
        out: list[Any] = []
        if self.settings.proposer in ("offline", "both"):
            out.append(OfflineProposer(self.predictor(), self.guardrails(), search_trials=self.settings.search_trials,
                                       batch=max(2, self.workers)))
        if self.settings.proposer in ("claude", "both"):
            from autoresearch_dagster.agents.claude import ClaudeProposer

            out.append(ClaudeProposer(model=self.settings.claude_model, guardrails=self.guardrails()))
        return out

    # ------------------------------------------------------------------ steps

    @property
    def running(self) -> bool:
        return self.state.status == "running"

    def current_plan(self) -> RoundPlan | None:
        """The round planned and not closed yet (what the experiment steps run), if any."""
        if not self.state.rounds or self.state.rounds[-1].get("status") != "planned":
            return None
        return RoundPlan.from_dict(json.loads(Path(self.state.rounds[-1]["plan"]).read_text()))

    def end_decision(self) -> dict[str, Any]:
        """The decision a step reports once the campaign has ended (nothing to promote, nothing next)."""
        return {"round": len(self.state.rounds), "era": self.state.era.index, "promote": False, "proposal_id": None,
                "experiment_id": None, "config": None, "ratio": None, "ci": None, "next": "end",
                "ended_because": self.state.ended_because, "reason": f"campaign ended: {self.state.ended_because}",
                "decided_at": _now()}

    def measure(self, *, _retried: bool = False) -> Era:
        """The era's noise floor; its runs become the shared control; calibration; replication check. Runs of
        two engine versions (an upgrade while the floor was measured) set no floor: it is measured again on the
        version the engine now reports (once; a second mix ends the campaign)."""
        from autoresearch_dagster.experiments.noise import measure_noise
        from autoresearch_dagster.measure.capacity import curve_run

        self.engine_bump()
        era = self.state.era
        if not self.running:
            return era
        if era.noise and self.state.phase != "measure":
            return era  # measured already (an engine re-observed at the same version changes nothing)
        problem = self.budget_problem(noise_cost=True)
        if problem and era.index > 0:
            return self._end(problem)
        self.say(f"era {era.index}: noise floor of {era.config_hash} ({self.profile.noise_runs} runs)")
        try:
            noise = measure_noise(self.endpoint, era.config, self.pool, engine=self.engine, runs=self.profile.noise_runs,
                                  results=self.results, settings=self.harness(), campaign=self.campaign,
                                  progress=lambda m: self.say("  " + m))
        except EngineError as e:
            # too few valid runs to set a noise floor (or the engine failed): the era has no capacity to compare
            # against, so the campaign ends here with its state saved (its runs are in the lake, the invalid ones marked)
            self.state.spent["gpu_seconds"] += float(getattr(e, "gpu_seconds", 0.0))
            what = "the baseline" if era.index == 0 else f"the promoted config of {era.source_experiment_id}"
            self.state.open_questions.append(f"the noise floor of {what} ({era.config_hash}) could not be measured: {e}")
            return self._end(f"the noise floor of {what} could not be measured")
        valid = [r for r in noise.runs if r.valid]
        mixed = sorted({r.engine_version for r in valid} - {"", "unknown"})
        if len(mixed) > 1:  # the engine changed under the noise floor: its runs are not pooled into one
            self.state.spent["gpu_seconds"] += float(sum(r.gpu_seconds for r in noise.runs))
            old = era.engine_version
            self.observe_version(valid[-1].engine_version)
            if _retried:
                self.state.open_questions.append(
                    f"the noise floor of {era.config_hash} mixed engine versions {', '.join(mixed)} twice")
                return self._end("the engine version changed while the noise floor was measured, twice")
            era.engine_version = self.engine_version
            self.save()
            self.say(f"  noise runs of engine versions {', '.join(mixed)} (was {old}): not pooled, measured again "
                     f"on {self.engine_version}")
            return self.measure(_retried=True)
        self._add_control_runs(valid, version=noise.engine_version)
        gpu_s = float(sum(r.gpu_seconds for r in noise.runs))
        self.state.spent["gpu_seconds"] += gpu_s
        if not noise.floor.median > 0 or not math.isfinite(noise.capacity_cv):
            # no rate met the SLA: a capacity ratio against zero means nothing, so no verdict can be reached
            what = "the baseline" if era.index == 0 else f"the promoted config of {era.source_experiment_id}"
            self.state.open_questions.append(
                f"{what} ({era.config_hash}) met the SLA {self.state.sla} at no measured rate (median capacity "
                f"{noise.floor.median:g} req/s over {len(noise.capacities)} runs): loosen the SLA or fix the config")
            return self._end(f"{what} meets the SLA at no measured rate")
        margin = stats.decision_margin(noise.capacity_cv, self.budget(),
                                       min_margin=self.harness().min_margin)
        median_run = min(valid, key=lambda r: abs((r.value("capacity_interp_rps") or 0) - noise.floor.median))
        curve = curve_run(valid, noise.floor.median) or median_run  # the cold first run: light load to the break
        failing = [t for st in median_run.steps if not st.get("meets_sla", True) for t in st.get("failed_terms") or []]
        era.noise = {"noise_id": noise.noise_id, "median": noise.floor.median, "ci_low": noise.floor.ci_low,
                     "ci_high": noise.floor.ci_high, "cv": noise.capacity_cv, "capacities": noise.capacities,
                     "margin": margin, "gpu_seconds": gpu_s, "engine_version": noise.engine_version,
                     "resolved": resolved_config(median_run.server_info, self.endpoint.engine), "limiting": str(failing[0]) if failing else "",
                     "median_run_id": median_run.run_id, "curve_run_id": curve.run_id, "runs": len(noise.capacities),
                     # what a capacity per GPU divides by: GPUs of one server, or an autoscaled fleet's held GPUs
                     "gpus_held": float(statistics.median([r.gpus_held or self.endpoint.gpus for r in valid]))}
        write_json(self._era_dir() / "noise.json", json_safe(noise.to_dict()))
        self.say(f"  capacity {noise.floor.median:.2f} req/s (95% CI {noise.floor.ci_low:.2f}-{noise.floor.ci_high:.2f}), "
                 f"CV {noise.capacity_cv:.2%}, verdict margin {margin:.2%}")
        if era.index > 0 and era.reason != "engine_bump":
            self._replication(era)
        if self.settings.calibrate:
            self._calibrate(era, curve)
        self.state.phase = "diagnose"
        self.save()
        return era

    def budget(self) -> Budget:
        return Budget(initial_runs_per_arm=self.profile.initial_runs_per_arm,
                      max_runs_per_arm=self.profile.max_runs_per_arm)

    def _replication(self, era: Era) -> None:
        prev = self.state.eras[era.index - 1]
        if not same_version(prev.engine_version, era.engine_version):
            era.replication = {"replicated": None, "comparable": False, "rollback_checked": True,
                               "reason": f"the previous baseline ran on engine {prev.engine_version}, this one on "
                                         f"{era.engine_version}: not compared"}
            return
        before = [float(r.value("capacity_interp_rps")) for r in self.control_runs(prev)
                  if r.value("capacity_interp_rps") is not None]
        after = era.noise["capacities"]
        if len(before) < 2 or len(after) < 2:
            return
        v = stats.verdict(before, after, noise_cv=float(era.noise["cv"]), min_margin=self.harness().min_margin,
                          seed=self.settings.seed)
        src = next((e for e in self.state.experiments if e["experiment_id"] == era.source_experiment_id), {})
        replicated = v.ratio_median >= 1 + float((prev.noise or {}).get("margin") or 0.02) / 2
        era.replication = {"ratio": v.ratio_median, "ci_low": v.ci_low, "ci_high": v.ci_high, "verdict": v.verdict,
                           "experiment_ratio": src.get("ratio_median"), "replicated": bool(replicated),
                           "rollback_checked": False}
        self.say(f"  promotion re-measured: {v.ratio_median:.3f}x the previous baseline (experiment said "
                 f"{src.get('ratio_median') or float('nan'):.3f}x): {'replicated' if replicated else 'NOT replicated'}")

    def _calibrate(self, era: Era, curve: RunRecord) -> None:
        try:
            sur = self.surrogate()
            before = sur.model_id
            cal = sur.calibrate(era.config, curve.steps)
        except (SpecError, ValueError) as e:
            self.say(f"  surrogate calibration skipped: {e}")
            return
        version = grounding.store(self, cal, config=era.config, reason="campaign",
                                  source=f"campaign {self.state.campaign_id} era {era.index} noise run "
                                         f"{curve.run_id}") if sur.model_id != before else None
        self.state.surrogate = {**self.state.surrogate, "efficiency": sur.efficiency.__dict__, "calibration": cal,
                                "version": version or self.state.surrogate.get("version")}
        if sur.model_id != before:
            self.say(f"  surrogate calibrated on {cal.get('points')} steps: error {cal.get('error_before', 0):.1%} -> "
                     f"{cal.get('error_after', 0):.1%} ({', '.join(f'{k}={v:.3g}' for k, v in cal['params'].items())})")

    def diagnose(self, report: dict[str, Any] | None = None, report_path: str | None = None) -> dict[str, Any]:
        """Diagnose the era's baseline (reusing its noise floor's load curve: ``capacity.curve_run``), or take ``report``."""
        if self.engine_bump() is not None:
            self.measure()
        era = self.state.era
        if not self.running:
            return {"hypotheses": era.hypotheses}
        if report is None:
            from autoresearch_dagster.diagnose import diagnose

            noise = json.loads((self._era_dir() / "noise.json").read_text())
            curve = next((r for r in noise["run_details"] if r["run_id"] == era.curve_run_id), None)
            out = self._era_dir() / "diagnosis"
            rep = diagnose(self.endpoint, self.pool, engine=self.engine, config=era.config, out_dir=out, capacity=curve,
                           measurement=self.profile, probes=self.settings.diagnosis_probes, memory_path=self.memory.root / "probes.jsonl" if self.memory
                           else None, seed=self.settings.seed, progress=lambda m: self.say("  " + m))
            report = json_safe(rep.to_json())
            report_path = str(write_json(out / "report.json", report))
            (out / "report.md").write_text(rep.to_markdown())
        era.hypotheses = list(report.get("hypotheses") or [])
        era.report_path = report_path
        top = era.hypotheses[:3]
        self.say("  hypotheses: " + "; ".join(f"{h['bottleneck']} ({float(h['score']):.2f})" for h in top))
        self.state.phase = "plan"
        self.save()
        return report

    def _brief(self, round_no: int) -> ResearchBrief:
        era = self.state.era
        n = era.noise or {}
        history = [{k: e.get(k) for k in ("experiment_id", "proposal_id", "proposer", "direction", "kind",
                                          "intervention", "candidate_config", "candidate_hash", "baseline_hash",
                                          "prediction", "verdict", "ratio_median", "ci_low", "ci_high", "reason")}
                   for e in self.state.experiments]
        prior = self.memory.similar(self.profile_for_memory(), exclude_endpoint=self.endpoint.name) if self.memory else []
        return ResearchBrief(
            campaign_id=self.state.campaign_id, round=round_no, endpoint=self.endpoint.name, model=self.endpoint.model,
            gpu=self.endpoint.hardware.gpu, gpus=self.endpoint.gpus, engine=self.endpoint.engine, sla=self.state.sla,
            pool_id=self.state.pool_hash, baseline_config=era.config, baseline_hash=era.config_hash,
            resolved_baseline=n.get("resolved") or {},
            baseline={"capacity_rps": n.get("median"), "ci": [n.get("ci_low"), n.get("ci_high")],
                      "capacity_rps_per_gpu": (n.get("median") or 0) / (n.get("gpus_held") or self.endpoint.gpus),
                      "limiting_sla_term": n.get("limiting")},
            noise={"cv": n.get("cv"), "runs": n.get("runs"), "margin": n.get("margin")},
            experiment_ids=[e["experiment_id"] for e in self.state.experiments], history=history,
            prior_findings=prior, direction="scheduling_cache", question="", hypotheses=era.hypotheses,
            max_proposals=2, guardrails=self.guardrails().describe(), tested_configs=self._tested(),
            gate_failures=list(self._gate_failures().values()), seed=self.settings.seed)

    def _tested(self) -> dict[str, str]:
        era = self.state.era
        versions = {e.index: e.engine_version for e in self.state.eras}
        # tried against this baseline on this engine version (an engine_bump era tries them again)
        out = {e["candidate_hash"]: f"{e['verdict']} in {e['experiment_id']} (this campaign)"
               for e in self.state.experiments if e.get("baseline_hash") == era.config_hash
               and same_version(e.get("engine_version") or versions.get(e.get("era")), era.engine_version)}
        if self.memory:
            out = {**self.memory.tested(self.endpoint.name, era.config_hash, self.conditions()), **out}
        return out

    def _gate_failures(self) -> dict[str, list[str]]:
        """Lossy settings that failed the correctness gate: in this campaign, or remembered for this endpoint."""
        remembered = self.memory.gate_failures(self.endpoint.name) if self.memory else {}
        return {**remembered, **self.state.gate_failures}

    def _toolbox(self) -> ToolBox:
        era = self.state.era
        report = json.loads(Path(era.report_path).read_text()) if era.report_path and Path(era.report_path).exists() \
            else {"hypotheses": era.hypotheses}
        curve = []
        for r in self.control_runs()[:1]:
            curve = [{k: s.get(k) for k in ("rate_rps", "achieved_rps", "meets_sla", "failed_terms", "ttft_ms",
                                             "tpot_ms", "itl_ms", "e2e_ms")} for s in r.steps]
        history = [{k: e.get(k) for k in ("experiment_id", "intervention", "verdict", "ratio_median", "ci_low",
                                          "ci_high", "prediction", "baseline_hash")} for e in self.state.experiments]
        profile = self.profile_for_memory() if self.memory else {}

        def query(knob: str | None) -> list[dict[str, Any]]:
            rows = self.memory.similar(profile, k=20) if self.memory else []
            return [r for r in rows if knob is None or knob in r["technique"]]

        return ToolBox(report=report, load_curve=curve, history=history, memory_query=query,
                       engine=self.endpoint.engine)

    def plan(self) -> RoundPlan | None:
        """The next round's experiments (None when the campaign ended instead)."""
        if not self.running or self.engine_bump() is not None or self.state.era.noise is None:
            return None  # an engine bump re-measures first (noise_baseline observes the engine in Dagster)
        problem = self.budget_problem(experiment=True)
        if problem:
            self._end(problem)
            return None
        era = self.state.era
        round_no = len(self.state.rounds) + 1
        b = self.settings.budget
        left = (b.max_experiments - int(self.state.spent["experiments"])) if b.max_experiments else 10 ** 6
        slots = min(self.settings.experiments_per_round, left)
        brief = self._brief(round_no)
        stats_ = {d: DirectionStat(**s) for d, s in self.state.direction_stats.items()}
        pool_entries = [p for p in self.state.diversity_pool if era.index not in p.get("tried_in_eras", [])]
        inputs = RoundInputs(brief=brief, stats=stats_, tested=self._tested(), gate_failures=self._gate_failures(),
                             last_promotion=self.state.last_promotion, diversity_pool=pool_entries)
        self.say(f"round {round_no} (era {era.index}): orchestrator opens {self.settings.directions_per_round} "
                 "direction(s)")
        def plan_for(exclude: frozenset[str]) -> RoundPlan:
            return plan_round(inputs, self.proposers(), guardrails=self.guardrails(), predictor=self.predictor(),
                              max_experiments=slots * (self.settings.prescreen_pool if self.settings.prescreen else 1),
                              n_directions=self.settings.directions_per_round, tools=self._toolbox(),
                              trace_dir=self.dir / "traces", exhausted_after=self.settings.exhausted_after,
                              exclude=exclude)

        plan = plan_for(frozenset())
        # a round whose directions gave no evidence-supported experiment opens the directions it has not opened
        # yet before the campaign ends: the diagnosis ranks directions, it does not rule the others out
        while not plan.proposals and plan.directions:
            opened = frozenset(d["direction"] for d in plan.directions)
            more = plan_for(opened)
            if not more.directions:
                break
            self.say(f"  nothing evidence-supported in {', '.join(sorted(opened))}: opening "
                     f"{', '.join(d['direction'] for d in more.directions)}")
            plan = merge_plans(plan, more)
        if self.settings.drafter and any(d["direction"] == "speculative" for d in plan.directions):
            self._drafter_proposal(plan, inputs.brief, slots)
        if not plan.proposals and self.settings.exploit and self.predictor() is not None:
            # every direction gave nothing with budget left: the surrogate's optimistic bound decides the ending
            extra, why = exploit_proposals(inputs, self.predictor(), self.guardrails(),
                                           max_proposals=min(slots, self.settings.exploit), seed=self.settings.seed)
            plan.proposals = extra
            plan.note = "; ".join(n for n in (plan.note, why) if n)
            self.say(f"  {why}")
        if self.settings.prescreen:
            self._prescreen(plan, slots)
        rollback = self._rollback_control(brief)
        if rollback is not None:
            plan.proposals = [rollback] + plan.proposals[:max(0, min(self.settings.experiments_per_round, left) - 1)]
        self._save_surrogate()
        for s in plan.sessions:
            self.say(f"  session {s['proposer']}/{s['direction']}: {len(s['proposals'])} proposal(s)"
                     + (f" ERROR {s['error']}" if s.get("error") else ""))
        for p in plan.proposals:
            self.say(f"  -> {p.id} [{p.proposer}/{p.kind}] {json.dumps(p.intervention.delta(), default=str)} predicted "
                     f"{p.prediction.capacity_ratio:.3f} [{p.prediction.ratio_low:.3f}, {p.prediction.ratio_high:.3f}]")
        for r in plan.rejected[:6]:
            self.say(f"  refused {r['proposal_id']}: {'; '.join(r['reasons'])[:160]}")
        path = write_json(self.dir / "rounds" / f"{round_no:03d}" / "plan.json", json_safe(plan.to_dict()))
        if self.results is not None:
            self.results.append_rows(self._proposal_rows(plan), endpoint=self.endpoint.name)
        offered = {pid for p in plan.proposals if p.kind == "follow_up" for pid in p.parent_ids}
        offered |= {pid for r in plan.rejected if r.get("kind") == "follow_up" for pid in r.get("parents", [])}
        for p in pool_entries:  # an entry is offered until it runs or is refused (not when the round was full)
            if p["id"] in offered:
                p.setdefault("tried_in_eras", []).append(era.index)
        era.rounds += 1
        self.state.rounds.append({"round": round_no, "era": era.index, "plan": str(path),
                                  "proposals": [p.id for p in plan.proposals], "experiments": [], "status": "planned",
                                  "directions": [d["direction"] for d in plan.directions], "note": plan.note})
        if not plan.proposals:
            why = ("every direction is exhausted" if not plan.directions else
                   "no evidence-supported experiment left")
            if "exploitation:" in plan.note:
                why += " (" + plan.note.split("exploitation: ", 1)[1] + ")"
            self._end(why)
            return None
        self.state.phase = "experiment"
        self.save()
        return plan

    def _drafter_proposal(self, plan: RoundPlan, brief: ResearchBrief, slots: int) -> None:
        """Rehearse a drafter adapted to the pool's training split and, when it accepts enough more than the
        stock one and the surrogate's bound with its measured acceptance reaches the margin, put the drafter
        experiment first in the round (``campaign.drafter_step``)."""
        s = self.settings
        if len(self.state.drafters) >= s.drafter_variants:
            return
        d = self.dir / "drafters"
        rehearsal_dir, full_dir = d / f"r{plan.round:03d}-rehearsal", d / f"r{plan.round:03d}-adapted"
        entry: dict[str, Any] = {"round": plan.round, "era": self.state.era.index, "rehearsal_dir": str(rehearsal_dir),
                                 "dir": str(full_dir), "proposal_id": None}
        try:
            summary = drafter_step.rehearse(drafter_step.pool_path(self.pool), rehearsal_dir,
                                            steps=s.drafter_rehearsal_steps, requests=s.drafter_rehearsal_requests,
                                            overrides=s.drafter_train, say=lambda m: self.say("  " + m))
        except (SpecError, ValueError) as e:
            why = f"drafter adaptation cannot apply: {e}"
            entry.update(status="cannot_apply", note=why)
        else:
            self.state.spent["gpu_seconds"] += summary["wall_s"]  # the trainer holds one device
            entry["rehearsal"] = summary
            why = drafter_step.rehearsal_verdict(summary, s.drafter_min_gain)
            prop = None
            if why is None:
                prop, why = drafter_step.proposal_for(brief, self.predictor(), self.guardrails(),
                                                      rehearsal_dir=rehearsal_dir, full_dir=full_dir,
                                                      summary=summary, tested=self._tested())
            else:
                why = "drafter rehearsal: " + why
            if prop is not None:
                plan.proposals = [prop] + plan.proposals[:max(0, slots - 1)]
                entry["proposal_id"] = prop.id
            entry.update(status="proposed" if prop is not None else "not_proposed", note=why)
        self.state.drafters.append(entry)
        plan.note = "; ".join(n for n in (plan.note, why) if n)
        self.say(f"  {why}")
        self.save()

    def _train_drafter(self, proposal: Proposal) -> tuple[dict[str, Any] | None, str | None]:
        """(the full training's summary, None) or (None, why it did not train); a finished training is reused."""
        full_dir = Path(proposal.candidate_config[drafter_step.PATH_KNOB])
        entry = next((e for e in self.state.drafters if e.get("proposal_id") == proposal.id), None)
        if entry is not None and entry.get("full") and (full_dir / "acceptance.json").is_file():
            return entry["full"], None
        rehearsal = (entry or {}).get("rehearsal") or {}
        full_steps = drafter_step.full_steps(self.settings.drafter_train)
        estimate = float(rehearsal.get("wall_s") or 0.0) * full_steps / max(1, rehearsal.get("steps") or 1)
        problem = self.budget_problem(experiment=True, pending_gpu_seconds=estimate)
        if problem:
            return None, f"drafter training not started: {problem} (training needs ~{estimate / 3600:.3g} GPU-hours)"
        summary = drafter_step.train_full(drafter_step.pool_path(self.pool), full_dir,
                                          overrides=self.settings.drafter_train, say=lambda m: self.say("  " + m))
        self.state.spent["gpu_seconds"] += summary["wall_s"]
        if entry is not None:
            entry["full"] = summary
        self.save()
        if not summary["gate_passed"]:
            return None, "the adapted drafter failed the greedy gate (its output differed from the target's)"
        return summary, None

    def _prescreen(self, plan: RoundPlan, slots: int) -> None:
        """Keep the round's promising candidates (``agents.prescreen``); the rest are recorded as screened."""
        margin = float((self.state.era.noise or {}).get("margin") or 0.02)
        res = prescreen(plan.proposals, self.predictor(), self.state.era.config, margin=margin,
                        gain=self.settings.prescreen_gain, slots=slots)
        plan.proposals = res.kept
        plan.rejected += res.screened
        write_json(self.dir / "rounds" / f"{plan.round:03d}" / "prescreen.json", json_safe({
            "floor": 1 + self.settings.prescreen_gain * margin, "margin": margin, "slots": slots,
            "kept": [p.id for p in res.kept], "screened": [s["proposal_id"] for s in res.screened],
            "predictions": res.predictions}))
        plan.note += f"; pre-screen on the calibrated emulator kept {len(res.kept)}, screened out {len(res.screened)}"
        for s in res.screened:
            self.say(f"  screened {s['proposal_id']}: {s['reasons'][0][:160]}")

    def _rollback_control(self, brief: ResearchBrief) -> Proposal | None:
        era = self.state.era
        rep = era.replication
        if not rep or rep.get("replicated") or rep.get("rollback_checked") or era.previous_config is None:
            return None
        rep["rollback_checked"] = True
        prev = dict(era.previous_config)
        pred = self.predictor().predict(era.config, [prev])[0]
        if not pred.get("feasible"):
            return None
        return Proposal(
            id=f"r{brief.round}-rollback-{era.index}", endpoint=brief.endpoint, campaign_id=brief.campaign_id,
            round=brief.round, proposer="orchestrator", source="rollback", direction="control", kind="control",
            question="Does the promoted change keep its gain on fresh runs?",
            explanation=(f"the promotion of {era.source_experiment_id} did not replicate when its noise floor was "
                         f"re-measured ({rep['ratio']:.3f}x the previous baseline against "
                         f"{rep.get('experiment_ratio') or 0:.3f}x in the experiment); the previous config is "
                         "tested against it, and promoted back if it is better"),
            evidence=[f"re-measured ratio {rep['ratio']:.3f} (CI {rep['ci_low']:.3f}-{rep['ci_high']:.3f})"],
            intervention=Intervention(changes=[KnobChange(knob=k, value=v) for k, v in diff(era.config, prev).items()]),
            prediction=self.predictor().prediction(pred),
            falsification="the promotion stands if the previous config is not better than it",
            candidate_config=prev)

    def _proposal_rows(self, plan: RoundPlan) -> dict[str, list[dict]]:
        now = utc_now()
        rows = []
        for p, status, reasons in [(p, "planned", []) for p in plan.proposals]:
            rows.append({"proposal_id": p.id, "campaign_id": self.state.campaign_id, "round": plan.round,
                         "proposer": p.proposer, "source": p.source, "direction": p.direction, "kind": p.kind,
                         "question": p.question, "explanation": p.explanation,
                         "intervention_json": json.dumps(p.intervention.model_dump(mode="json"), sort_keys=True),
                         "candidate_hash": p.config_hash, "predicted_ratio": p.prediction.capacity_ratio,
                         "ratio_low": p.prediction.ratio_low, "ratio_high": p.prediction.ratio_high,
                         "confidence": p.prediction.confidence,
                         "latency_json": json.dumps([t.model_dump() for t in p.prediction.latency]),
                         "falsification": p.falsification, "trace_path": p.trace, "status": status,
                         "reasons": reasons, "recorded_at": now})
        for r in plan.rejected:
            rows.append({"proposal_id": r["proposal_id"], "campaign_id": self.state.campaign_id, "round": plan.round,
                         "proposer": r.get("proposer"), "direction": r.get("direction"),
                         "status": r.get("status", "refused"),
                         "intervention_json": json.dumps(r.get("intervention"), sort_keys=True, default=str),
                         "reasons": [str(x) for x in r.get("reasons") or []], "recorded_at": now})
        return {"proposals": rows}

    def run_proposal(self, plan: RoundPlan, proposal: Proposal) -> dict[str, Any]:
        """One experiment of the round against the era's shared control (writes only its own file)."""
        era = self.state.era
        out = self.dir / "rounds" / f"{plan.round:03d}" / "experiments" / f"{proposal.id}.json"
        if out.exists():  # a resumed round: this experiment already ran
            return json.loads(out.read_text())["record"]
        base = {"experiment_id": f"e-{uuid.uuid4().hex[:12]}", "proposal_id": proposal.id, "round": plan.round,
                "era": era.index, "proposer": proposal.proposer, "source": proposal.source,
                "direction": proposal.direction, "kind": proposal.kind, "intervention": proposal.intervention.delta(),
                "candidate_config": proposal.candidate_config, "candidate_hash": config_hash(proposal.candidate_config),
                "baseline_hash": era.config_hash, "prediction": proposal.prediction.model_dump(mode="json"),
                "trace": proposal.trace, "lossy": is_lossy(proposal.candidate_config, era.config, self.endpoint.engine),
                "engine_version": era.engine_version}
        if not same_version(era.engine_version, self.engine_version):
            record = {**base, "verdict": "invalid", "confirmed": False, "ratio_median": None, "ci_low": None,
                      "ci_high": None, "margin": None, "gpu_seconds": 0.0, "runs": 0, "ran": False,
                      "reason": f"not run: the engine now reports {self.engine_version}, the era's control ran on "
                                f"{era.engine_version} (a fresh baseline is measured first)",
                      "invalid_reasons": ["engine version changed"], "correctness": None}
            write_json(out, json_safe({"record": record}))
            return record
        if proposal.is_patch:
            record = {**base, "verdict": "invalid", "confirmed": False, "ratio_median": None, "ci_low": None,
                      "ci_high": None, "margin": None, "gpu_seconds": 0.0, "runs": 0, "ran": False,
                      "reason": f"engine patch not testable here: the {self.state.engine} engine has no patchable "
                                "source (CPU checks and a rehearsal need the engine's source tree)",
                      "invalid_reasons": ["engine patch not testable here"], "correctness": None}
            write_json(out, json_safe({"record": record}))
            return record
        drafter = None
        if proposal.source == drafter_step.SOURCE:
            drafter, problem = self._train_drafter(proposal)
            if problem:
                record = {**base, "verdict": "invalid", "confirmed": False, "ratio_median": None, "ci_low": None,
                          "ci_high": None, "margin": None, "gpu_seconds": 0.0, "runs": 0, "ran": False,
                          "reason": problem, "invalid_reasons": [problem], "correctness": None}
                write_json(out, json_safe({"record": record}))
                return record
        left = self.time_left()
        budget = Budget(initial_runs_per_arm=self.profile.initial_runs_per_arm,
                        max_runs_per_arm=self.profile.max_runs_per_arm,
                        max_wall_s=max(1.0, left) if left is not None else None)
        key = gate_key(era.config, proposal.candidate_config, self.endpoint.engine)
        self.say(f"experiment {proposal.id}: {json.dumps(proposal.intervention.delta(), default=str)}")
        res = run_experiment(self.endpoint, era.config, proposal.candidate_config, self.pool, engine=self.engine,
                             results=self.results, settings=self.experiment_harness(era, proposal.id), budget=budget,
                             noise_cv=float(era.noise["cv"]), campaign=self.campaign,
                             experiment_id=base["experiment_id"], kind=proposal.kind, parent_id=proposal.id,
                             progress=lambda m: self.say("  " + m),
                             control=SharedControl(self.control_runs(), anchor_every=self.settings.anchor_every),
                             comparisons=max(1, len(plan.proposals)), correctness=self.state.gate_cache.get(key))
        v = res.stats
        ref = (era.noise or {}).get("engine_version")
        others = sorted({r.engine_version for r in res.runs if not same_version(r.engine_version, ref)})
        if others:  # the engine changed under the experiment: its runs are not compared with the era's control
            res.verdict, res.confirmed = "invalid", False
            res.reason = f"runs of engine {', '.join(others)} against a control of {ref}: not compared"
            res.invalid_reasons = [*res.invalid_reasons, "engine version changed"]
            self.observe_version(others[-1])  # closing the round then opens the engine_bump era
        record = {**base, "experiment_id": res.experiment_id, "verdict": res.verdict, "confirmed": res.confirmed,
                  "ratio_median": v.ratio_median if v else None, "ci_low": v.ci_low if v else None,
                  "ci_high": v.ci_high if v else None, "margin": v.margin if v else None,
                  "confidence": v.confidence if v else None, "gpu_seconds": res.gpu_seconds, "runs": len(res.runs),
                  "ran": True, "reason": res.reason, "invalid_reasons": res.invalid_reasons,
                  "correctness": res.correctness, "gate_key": key, "control_note": res.control_note,
                  "anchor_run_ids": [r.run_id for r in res.runs if r.arm == "baseline" and r.valid],
                  "lossy": res.lossy, "gpu_savings": res.gpu_savings,
                  **({"drafter": drafter} if drafter is not None else {})}
        write_json(out, json_safe({"record": record, "result": res.summary(),
                                   "anchors": [r.to_dict() for r in res.runs if r.arm == "baseline" and r.valid]}))
        self.say(f"  -> {res.verdict.upper()}" + (f" ratio {v.ratio_median:.3f} [{v.ci_low:.3f}, {v.ci_high:.3f}]" if v
                                                   else "") + f" ({res.reason[:120]})")
        return record

    def run_round(self, plan: RoundPlan) -> list[dict[str, Any]]:
        """Every experiment of the plan, one after another (each runs its runs in parallel); one the deadline
        leaves no time for, or whose expected GPU-hours would overrun the budget, is not started."""
        out: list[dict[str, Any]] = []
        for p in plan.proposals:
            pending = sum(float(r.get("gpu_seconds") or 0.0) for r in out if r.get("ran"))
            problem = self.budget_problem(experiment=True, pending_gpu_seconds=pending)
            if problem and out:
                self.say(f"  {p.id} not run: {problem}")
                continue
            out.append(self.run_proposal(plan, p))
        return out

    def close(self, plan: RoundPlan | None, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Score, remember and decide after a round (see the module docstring); returns the decision."""
        if plan is None or not self.running:
            return self.end_decision()
        st = self.state
        acc: dict[str, list[dict[str, Any]]] = {"findings": [], "predictions": [], "errors": []}
        for rec in records:
            self._take(rec, plan, acc)
        decision = self._decide(plan, [e for e in st.experiments if e["round"] == plan.round])
        if decision["promote"] and not same_version(st.era.engine_version, self.engine_version):
            decision.update(promote=False, reason=decision["reason"] + f"; not promoted: the engine now reports "
                            f"{self.engine_version} (measured on {st.era.engine_version}): a fresh baseline first")
        elif decision["promote"] and self.settings.ablate:
            self._ablate(plan, decision, acc)
        self._budget_decision(decision)
        findings, predictions, errors = acc["findings"], acc["predictions"], acc["errors"]
        if self.results is not None:
            if findings:
                self.results.append_rows(finding_rows(findings, st.campaign_id), endpoint=self.endpoint.name)
            if predictions:
                self.results.append_rows({"predictions": predictions}, endpoint=self.endpoint.name)
            if errors:
                self.results.append_rows({"emulator_errors": errors}, endpoint=self.endpoint.name)
        if self.memory is not None:
            self._version_memory(f"{self.endpoint.name}: round {plan.round} of campaign {st.campaign_id}")
        self._recalibrate_on_drift()
        self._save_surrogate()
        st.rounds[-1].update({"experiments": [e["experiment_id"] for e in st.experiments if e["round"] == plan.round],
                              "status": "closed", "decision": decision})
        st.decisions.append(decision)
        st.phase = "end" if decision["next"] == "end" else ("measure" if decision["promote"] else "plan")
        if decision["next"] == "end":
            self._end(decision["ended_because"])
        elif not same_version(st.era.engine_version, self.engine_version):
            decision["next"] = "measure"  # not another round on the old control: the engine_bump era first
            self.engine_bump()
        self.save()
        return decision

    def _take(self, rec: dict[str, Any], plan: RoundPlan, acc: dict[str, list[dict[str, Any]]]) -> None:
        """One experiment's record into the campaign: score, spend, direction statistics, the correctness cache,
        the emulator's error, the control's new anchors, memory (``acc`` gathers the round's lake rows)."""
        era, st = self.state.era, self.state
        margin = float(era.noise.get("margin") or 0.02)
        cond = self.conditions()
        sur = self.surrogate()
        if any(e["experiment_id"] == rec["experiment_id"] for e in st.experiments):
            return
        rec = dict(rec)
        rec["score"] = scoring.score(rec["prediction"], rec["verdict"], rec.get("ratio_median"), margin)
        if rec.get("ran"):
            st.spent["experiments"] += 1
            st.spent["gpu_seconds"] += float(rec.get("gpu_seconds") or 0.0)
        gate_failed = rec.get("correctness") is not None and not rec["correctness"].get("passed")
        if rec["direction"] != "control" and rec.get("ran") and not gate_failed:
            # a gate failure is a correctness finding (learned as such), not a sign the direction is spent
            s = DirectionStat(**st.direction_stats.get(rec["direction"], {}))
            s.record(rec["verdict"])
            st.direction_stats[rec["direction"]] = s.__dict__
        if rec.get("correctness") is not None and rec.get("gate_key"):
            st.gate_cache[rec["gate_key"]] = rec["correctness"]
            failed = sorted(set(lossy_settings(rec["candidate_config"])) - set(lossy_settings(era.config)))
            if not rec["correctness"].get("passed") and failed:
                st.gate_failures[rec["experiment_id"]] = failed
        if rec["verdict"] in ("better", "same", "worse") and rec.get("ratio_median"):
            emu = grounding.emulator_prediction(sur, era.config, rec["candidate_config"], st.surrogate.get("version"))
            if emu is not None:  # the emulator's prediction beside the measurement
                st.residuals.append({"knobs": sorted(rec["intervention"]), "predicted": emu["ratio"],
                                     "measured": rec["ratio_median"], "experiment_id": rec["experiment_id"]})
                row = emulator_errors.error_row(
                    experiment_id=rec["experiment_id"], proposal_id=rec["proposal_id"], campaign_id=st.campaign_id,
                    round_no=plan.round, era=era.index, knobs=list(rec["intervention"]), emulated_ratio=emu["ratio"],
                    measured_ratio=rec["ratio_median"], verdict=rec["verdict"],
                    ci=(rec.get("ci_low"), rec.get("ci_high")), calibration_version=emu["calibration_version"],
                    surrogate_model=emu["surrogate_model"], baseline_rps=emu["baseline_rps"],
                    candidate_rps=emu["candidate_rps"], recorded_at=utc_now())
                emu["log_error"] = row["log_error"]
                acc["errors"].append(row)
            rec["emulator_prediction"] = emu
        if rec.get("anchor_run_ids"):
            anchors = json.loads((self.dir / "rounds" / f"{plan.round:03d}" / "experiments" /
                                  f"{rec['proposal_id']}.json").read_text()).get("anchors", [])
            self._add_control_runs([RunRecord(**{k: v for k, v in a.items() if k in RunRecord.__dataclass_fields__})
                                    for a in anchors])
        self._attribute(rec)
        self._diversity(rec, margin)
        bottleneck = next((h["bottleneck"] for h in era.hypotheses if set(rec["intervention"]) & set(h.get("knobs", []))),
                          None)
        finding = {"endpoint": self.endpoint.name, "campaign_id": st.campaign_id,
                   "experiment_id": rec["experiment_id"], "technique": technique(rec["intervention"]),
                   "bottleneck": bottleneck, "direction": rec["direction"], "outcome": outcome(rec["verdict"]),
                   "verdict": rec["verdict"], "ratio": rec.get("ratio_median"),
                   "ci": [rec.get("ci_low"), rec.get("ci_high")],
                   "lossy": rec.get("lossy"), "model": self.endpoint.model, "model_family": cond.model_family,
                   "gpu": cond.gpu, "gpus": cond.gpus, "engine_version": cond.engine_version,
                   "traits": cond.traits, "reason": rec.get("reason", "")[:300]}
        if self.memory is not None:
            self.memory.record(self.endpoint.name, {
                "campaign_id": st.campaign_id, "experiment_id": rec["experiment_id"],
                "baseline_hash": rec["baseline_hash"], "candidate_hash": rec["candidate_hash"],
                "intervention": rec["intervention"], "candidate_config": rec["candidate_config"],
                "verdict": rec["verdict"], "ratio": rec.get("ratio_median"),
                "gate_failed": st.gate_failures.get(rec["experiment_id"]),
                "ci": [rec.get("ci_low"), rec.get("ci_high")], "reason": rec.get("reason", "")[:300],
                "conditions_key": cond.key(), "conditions": cond.__dict__}, finding if rec.get("ran") else None)
        if rec.get("ran"):
            acc["findings"].append(finding)
        acc["predictions"].append(self._prediction_row(rec, plan.round, margin))
        st.experiments.append(rec)

    def _version_memory(self, message: str) -> None:
        """Commit the memory's round; a failure is logged, told and kept in the state (the report shows it)."""
        try:
            self.memory.commit(message)
        except MemoryVersionError as e:
            log.warning("memory not versioned: %s", e)
            self.say(f"warning: memory not versioned: {e}")
            self.state.memory_problems.append(f"{message}: {e}")

    def _recalibrate_on_drift(self) -> None:
        """Re-calibrate when the emulator's error drifts (``agents.emulator_errors.drift``) over the experiments
        verified since the last calibration; the fit spans the baseline and those experiments' candidates."""
        limit, st = self.settings.recalibrate_error, self.state
        if limit is None:
            return
        since = int(st.surrogate.get("drift_from", 0))
        window = self.settings.recalibrate_window
        rows = [{"experiment_id": e["experiment_id"], "log_error": e["emulator_prediction"]["log_error"],
                 "calibration_version": 0, "recorded_at": i}
                for i, e in enumerate(st.experiments[since:]) if (e.get("emulator_prediction") or {}).get("log_error")
                is not None]
        d = emulator_errors.drift(rows, window=window, threshold=limit)
        if not d.drifting:
            return
        st.surrogate["drift_from"] = len(st.experiments)  # judged: the next check waits for new experiments
        self.say(f"  emulator error drifting ({d.reason}): re-calibrating")
        exps = [e for e in st.experiments if e["experiment_id"] in d.experiments]
        points = grounding.drift_points(self, exps)
        sur = self.surrogate()
        try:
            cal = sur.fit(st.era.config, points) if len(points) >= 2 else {"fitted": False,
                                                                           "reason": "fewer than 2 measured steps"}
        except (SpecError, ValueError) as e:
            cal = {"fitted": False, "reason": str(e)}
        version = grounding.store(self, cal, config=st.era.config, reason="drift", source=(
            f"campaign {st.campaign_id} era {st.era.index}: baseline and candidates of {', '.join(d.experiments)}"),
            detail={"drift": d.to_dict()}) if cal.get("fitted") else None
        st.surrogate.update(efficiency=sur.efficiency.__dict__, version=version or st.surrogate.get("version"))
        st.surrogate.setdefault("recalibrations", []).append({"drift": d.to_dict(), "fitted": cal.get("fitted"),
                                                              "version": version, "params": cal.get("params"),
                                                              "error_before": cal.get("error_before"),
                                                              "error_after": cal.get("error_after"),
                                                              "reason": cal.get("reason"), "at": _now()})
        self.say(f"  re-calibration on {len(points)} steps: " + (
            f"stored v{version}, error {cal['error_before']:.1%} -> {cal['error_after']:.1%}" if cal.get("fitted")
            else f"not kept ({cal.get('reason') or 'it did not lower the error'})"))

    def _prediction_row(self, rec: dict[str, Any], round_no: int, margin: float) -> dict[str, Any]:
        s, p = rec["score"], rec["prediction"]
        return {"proposal_id": rec["proposal_id"], "experiment_id": rec["experiment_id"],
                "campaign_id": self.state.campaign_id, "round": round_no, "proposer": rec["proposer"],
                "direction": rec["direction"], "kind": rec["kind"], "predicted_ratio": p["capacity_ratio"],
                "ratio_low": p["ratio_low"], "ratio_high": p["ratio_high"], "verdict": rec["verdict"],
                "measured_ratio": rec.get("ratio_median"), "margin": margin, "scored": s["scored"],
                "predicted_direction": s["predicted_direction"], "measured_direction": s["measured_direction"],
                "direction_hit": s["direction_hit"], "covered": s["covered"], "abs_log_error": s["abs_log_error"],
                "recorded_at": utc_now()}

    def _attribute(self, rec: dict[str, Any]) -> None:
        promo = self.state.last_promotion
        if rec["kind"] != "control" or not promo or rec["source"] in ("rollback", "ablation"):
            return
        group = rec["proposal_id"].rsplit("control-", 1)[-1]
        role = {"worse": "carries gain (reverting it loses capacity)", "same": "no effect in the combination",
                "better": "harmful in the combination"}.get(rec["verdict"], "unknown (invalid runs)")
        promo.setdefault("attribution", {})[group] = {"role": role, "verdict": rec["verdict"],
                                                      "knobs": sorted(rec["intervention"]),
                                                      "ratio": rec.get("ratio_median"),
                                                      "experiment_id": rec["experiment_id"]}
        promo["ablated"] = len(promo["attribution"]) >= len(control_groups(promo.get("delta") or {}))

    def _diversity(self, rec: dict[str, Any], margin: float) -> None:
        if not rec.get("ratio_median") or rec["verdict"] not in ("better", "same") or rec["kind"] == "control":
            return
        if rec["verdict"] == "same" and rec["ratio_median"] < 1 + margin / 2:
            return
        if rec.get("correctness") is not None and not rec["correctness"].get("passed"):
            return
        pool = [p for p in self.state.diversity_pool if p["technique"] != technique(rec["intervention"])]
        pool.append({"id": rec["experiment_id"], "delta": rec["intervention"], "technique": technique(rec["intervention"]),
                     "direction": rec["direction"], "ratio": rec["ratio_median"], "verdict": rec["verdict"],
                     "tried_in_eras": [self.state.era.index]})
        pool.sort(key=lambda p: -p["ratio"])
        self.state.diversity_pool = pool[: self.settings.diversity_size]

    def _decide(self, plan: RoundPlan, round_records: list[dict[str, Any]]) -> dict[str, Any]:
        era = self.state.era
        eligible = [r for r in round_records
                    if r["verdict"] == "better" and not r.get("invalid_reasons")
                    and (r.get("confirmed") or self.settings.confirm == "remeasure")
                    and (r.get("correctness") is None or r["correctness"].get("passed"))]
        summary = ", ".join(f"{r['proposal_id']}: {r['verdict']}" for r in round_records) or "nothing ran"
        decision: dict[str, Any] = {"round": plan.round, "era": era.index, "promote": False, "proposal_id": None,
                                    "experiment_id": None, "config": None, "ratio": None, "ci": None,
                                    "decided_at": _now()}
        eligible = [r for r in eligible if r.get("source") != "ablation"]  # an ablation answers for its candidate
        if eligible:
            best = max(eligible, key=lambda r: (r.get("ci_low") or 0.0, r.get("ratio_median") or 0.0))
            decision.update(promote=True, proposal_id=best["proposal_id"], experiment_id=best["experiment_id"],
                            config=best["candidate_config"], ratio=best["ratio_median"],
                            ci=[best["ci_low"], best["ci_high"]], kind=best["kind"],
                            reason=(f"{best['proposal_id']} is better: median ratio {best['ratio_median']:.3f}, "
                                    f"CI [{best['ci_low']:.3f}, {best['ci_high']:.3f}], margin {best['margin']:.3f}"
                                    + ("" if best.get("confirmed") else "; to be confirmed by its re-measured noise "
                                                                        "floor")))
        else:
            decision["reason"] = f"no promotable better candidate ({summary})"
        return decision

    def _budget_decision(self, decision: dict[str, Any]) -> dict[str, Any]:
        """What comes next within the budget: a promotion needs room to re-measure its noise floor."""
        problem = self.budget_problem(noise_cost=decision["promote"])
        if problem and decision["promote"]:
            decision.update(promote=False, reason=decision["reason"] + f"; not promoted: {problem} (no room to "
                                                                       "re-measure a new baseline)")
            self.state.open_questions.append(f"{decision['proposal_id']} measured better ({decision['ratio']:.3f}x) "
                                             f"but the campaign ran out of budget before promoting it")
        decision["next"] = "end" if problem else "continue"
        decision["ended_because"] = problem
        return decision

    def _ablate(self, plan: RoundPlan, decision: dict[str, Any], acc: dict[str, list[dict[str, Any]]]) -> None:
        """Before promoting a candidate that changes several knobs of one direction, measure it with each of them
        reverted (leave-one-out, against the era's shared control like any experiment) and promote the smallest
        set that is still better than the baseline and not worse than the full set beyond the noise floor (the
        verdict of the full set's runs against the variant's, at the era's noise CV and margin); repeated while a
        knob can be dropped. Each ablation run counts against the budget; one the budget has no room for (beside the
        new baseline's noise floor) is not run, and the reason is kept. The ablation is recorded in the decision
        (``ablation``), hence in the round and in the promoted era."""
        era = self.state.era
        full = next(e for e in self.state.experiments if e["experiment_id"] == decision["experiment_id"])
        delta = diff(era.config, full["candidate_config"])
        groups = {g: ks for g, ks in control_groups(delta).items() if len(ks) > 1 and g in ABLATED_DIRECTIONS}
        if not groups:
            return
        margin = float((era.noise or {}).get("margin") or 0.02)
        full_caps = self._candidate_capacities(full)
        resolved = (era.noise or {}).get("resolved") or {}
        noise_cost = float((era.noise or {}).get("gpu_seconds") or 0.0)
        ab: dict[str, Any] = {"experiment_id": full["experiment_id"], "full": delta, "full_ratio": full["ratio_median"],
                              "margin": margin, "groups": {g: list(ks) for g, ks in groups.items()},
                              "variants": [], "dropped": [], "skipped": None}
        current, current_rec = dict(full["candidate_config"]), full
        for group, knobs in groups.items():
            while True:
                kept = [k for k in knobs if k in diff(era.config, current)]
                if len(kept) < 2:
                    break
                tried = []
                for k in kept:
                    cfg = normalize({**current, k: era.config.get(k)}, era.config, resolved, self.endpoint.engine)
                    pid = f"{full['proposal_id']}-without-{k}" + ("" if current_rec is full else
                                                                  f"-{config_hash(current)[:6]}")
                    rec = next((e for e in self.state.experiments if e["proposal_id"] == pid
                                and e["round"] == plan.round), None)
                    if rec is None:
                        problem = self.budget_problem(experiment=True, pending_gpu_seconds=noise_cost)
                        if problem:
                            ab["skipped"] = f"{pid} not run: {problem}"
                            self.say(f"  ablation {pid} not run: {problem}")
                            break
                        rec = self.run_proposal(plan, self._ablation_proposal(plan, pid, full, cfg, k))
                        self._take(rec, plan, acc)
                        rec = self.state.experiments[-1] if self.state.experiments[-1]["proposal_id"] == pid else rec
                    caps = self._candidate_capacities(rec)
                    vs = stats.verdict(full_caps, caps, noise_cv=float(era.noise["cv"]),
                                       min_margin=self.harness().min_margin, seed=self.settings.seed) \
                        if len(full_caps) >= 2 and len(caps) >= 2 else None
                    ok = (rec["verdict"] == "better" and not rec.get("invalid_reasons") and vs is not None
                          and vs.verdict != "worse")
                    ab["variants"].append({"proposal_id": pid, "experiment_id": rec["experiment_id"], "without": k,
                                           "config": cfg, "verdict": rec["verdict"], "ratio": rec.get("ratio_median"),
                                           "ci": [rec.get("ci_low"), rec.get("ci_high")],
                                           "vs_full": {"verdict": vs.verdict, "ratio": vs.ratio_median,
                                                       "ci": [vs.ci_low, vs.ci_high], "margin": vs.margin}
                                           if vs else None, "within_margin": ok})
                    if ok:
                        tried.append((vs.ratio_median, k, cfg, rec))
                if not tried:
                    break
                _, k, current, current_rec = max(tried, key=lambda t: t[0])
                ab["dropped"].append(k)
                self.say(f"  ablation: {k} adds nothing beyond the noise floor ({current_rec['ratio_median']:.3f}x "
                         f"without it, {full['ratio_median']:.3f}x with it): dropped")
                if ab["skipped"]:
                    break
            if ab["skipped"]:
                break
        ab["promoted"] = diff(era.config, current)
        decision["ablation"] = ab
        if current_rec is not full:
            decision.update(proposal_id=current_rec["proposal_id"], experiment_id=current_rec["experiment_id"],
                            config=current, ratio=current_rec["ratio_median"],
                            ci=[current_rec["ci_low"], current_rec["ci_high"]],
                            reason=decision["reason"] + f"; ablated to {json.dumps(ab['promoted'], default=str)} "
                                   f"(dropped {', '.join(ab['dropped'])}: not worse without them beyond the noise "
                                   "floor)")
        elif ab["skipped"]:
            decision["reason"] += f"; ablation incomplete ({ab['skipped']}): the full set is promoted"

    def _candidate_capacities(self, rec: dict[str, Any]) -> list[float]:
        """An experiment's candidate capacities (its file in the round's directory)."""
        path = self.dir / "rounds" / f"{int(rec['round']):03d}" / "experiments" / f"{rec['proposal_id']}.json"
        res = (json.loads(path.read_text()).get("result") or {}) if path.exists() else {}
        return [float(c) for c in res.get("capacities_candidate") or [] if c is not None]

    def _ablation_proposal(self, plan: RoundPlan, pid: str, full: dict[str, Any], cfg: dict[str, Any],
                           knob: str) -> Proposal:
        era = self.state.era
        pred = self.predictor().predict(era.config, [cfg])[0]
        prediction = self.predictor().prediction(pred) if pred.get("feasible") else {
            "capacity_ratio": full["ratio_median"], "ratio_low": full["ci_low"], "ratio_high": full["ci_high"],
            "basis": "the full candidate's measured ratio"}
        return Proposal(
            id=pid, endpoint=self.endpoint.name, campaign_id=self.state.campaign_id, round=plan.round,
            proposer="orchestrator", source="ablation", direction="control", kind="control",
            question=f"Does {full['proposal_id']} keep its gain without {knob}?",
            explanation=(f"{full['proposal_id']} changes several knobs of one direction and measured better "
                         f"({full['ratio_median']:.3f}x); before it is promoted it is measured with {knob} left at the "
                         "baseline's value, so a knob that adds nothing is not promoted with the others"),
            evidence=[f"{full['experiment_id']}: {full['ratio_median']:.3f}x "
                      f"[{full['ci_low']:.3f}, {full['ci_high']:.3f}]"],
            intervention=Intervention(changes=[KnobChange(knob=k, value=v) for k, v in diff(era.config, cfg).items()]),
            prediction=prediction, falsification=f"{knob} carries part of the gain if the ratio without it falls "
                                                 "below the full set's by more than the verdict margin",
            candidate_config=cfg)

    def set_baseline(self, config: dict[str, Any], *, experiment_id: str | None, reason: str = "promotion") -> Era:
        """A promoted (or rolled-back) config becomes the next era; the original stays the reference."""
        cur = self.state.era
        if config_hash(config) == cur.config_hash:
            return cur
        src = next((e for e in self.state.experiments if e["experiment_id"] == experiment_id), {})
        if src.get("source") == "rollback":
            reason = "rollback"
        era = Era(index=cur.index + 1, config=dict(config), config_hash=config_hash(config), reason=reason,
                  set_at=_now(), source_experiment_id=experiment_id, delta=diff(cur.config, config),
                  previous_config=dict(cur.config), engine_version=cur.engine_version,
                  ablation=next((d["ablation"] for d in reversed(self.state.decisions)
                                 if d.get("experiment_id") == experiment_id and d.get("ablation")), None))
        self.state.eras.append(era)
        self.state.last_promotion = {"experiment_id": experiment_id, "delta": era.delta, "previous_config": cur.config,
                                     "ablated": len(control_groups(era.delta)) < 2, "era": era.index}
        # good-but-different: an entry that touches the promoted knobs was a variant of the promoted idea
        self.state.diversity_pool = [p for p in self.state.diversity_pool
                                     if diff(config, {**config, **p["delta"]}) and p["id"] != experiment_id
                                     and not set(p["delta"]) & set(era.delta)]
        if self.results is not None:
            record_promotion(self.results, self.campaign, config, experiment_id=experiment_id)
        self._surrogate = None
        self.state.phase = "measure"
        self.save()
        self.say(f"promoted {experiment_id}: era {era.index} baseline {era.config_hash} "
                 f"({json.dumps(era.delta, default=str)})")
        return era

    def _end(self, why: str) -> Era:
        if self.state.status != "ended":
            self.say(f"campaign ends: {why}")
        self.state.status, self.state.ended_because, self.state.ended_at = "ended", why, _now()
        self.state.phase = "end"
        self.save()
        return self.state.era

    # ------------------------------------------------------------------ driver

    def run(self) -> dict[str, Any]:
        """Drive the campaign to its end in this process (the CLI and the benchmarks); returns the report."""
        t0 = time.monotonic()
        plan: RoundPlan | None = None
        while self.state.status == "running":
            phase = self.state.phase
            if phase == "measure":
                self.measure()
            elif phase == "diagnose":
                self.diagnose()
            elif phase == "plan":
                plan = self.plan()
            elif phase in ("experiment", "close"):
                if plan is None:
                    plan = RoundPlan.from_dict(json.loads(Path(self.state.rounds[-1]["plan"]).read_text()))
                records = self.run_round(plan)
                decision = self.close(plan, records)
                if decision["promote"]:
                    self.set_baseline(decision["config"], experiment_id=decision["experiment_id"])
                plan = None
            else:
                break
        self.state.spent["wall_s"] = float(self.state.spent.get("wall_s", 0.0)) + time.monotonic() - t0
        return self.finish()

    def gpu_savings(self) -> dict[str, Any] | None:
        """GPUs saved under the real demand curve by the best confirmed config against the original baseline, for an
        autoscaled endpoint (its experiments measured capacity only): ``gpu_savings_runs`` demand replays of each
        (``experiments.gpu_savings``), measured once per best config and kept in ``gpu_savings.json``. None when the
        endpoint does not autoscale, the setting is 0 or no config beat the original."""
        from autoresearch_dagster.campaign.report import best_era
        from autoresearch_dagster.experiments.gpu_savings import LABEL, format_line, measure_savings

        best, orig = best_era(self.state), self.state.original
        if self.endpoint.autoscaling is None or not self.settings.gpu_savings_runs or best.index == orig.index:
            return None
        path = self.dir / "gpu_savings.json"
        if path.exists():
            saved = json.loads(path.read_text())
            if saved.get("candidate_hash") == best.config_hash:
                return saved
        self.say(f"{LABEL}: {self.settings.gpu_savings_runs} demand replays of the original and of era {best.index}")
        out = measure_savings(self.endpoint, orig.config, best.config, self.pool, engine=self.engine,
                              runs=self.settings.gpu_savings_runs, settings=self.harness(), results=self.results,
                              campaign_id=self.state.campaign_id, progress=self.say)
        if out is not None:
            self.state.spent["gpu_seconds"] += out["gpu_seconds_spent"]
            write_json(path, json_safe(out))
            self.say(f"  {format_line(out)}")
        return out

    def finish(self) -> dict[str, Any]:
        """campaign.json, the progress plot, the review package and the lake's campaign_results row."""
        from autoresearch_dagster.campaign.report import build_report

        if self.state.status != "ended":
            self._end("stopped before its budget")
        report = build_report(self)
        self.save()
        return report
