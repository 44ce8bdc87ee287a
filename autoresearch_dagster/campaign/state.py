"""Owns a campaign's settings and its saved state: the working baselines (eras), rounds, experiments,
what was spent, what was learned, and where the loop stands.

The state is one JSON file (``<campaign dir>/state.json``) rewritten atomically after every step, so
a crashed or interrupted campaign resumes where it stopped (``phase``) and a budget that runs out
ends it with everything kept. Each era is one working baseline: the original (the campaign's
reference, never replaced) or a promotion, with its noise floor, diagnosis and the baseline runs
that serve as the shared control of its rounds. Every era records the engine version it was measured on:
an engine that reports another version mid-campaign opens an ``engine_bump`` era (same config, its own
noise floor, control and diagnosis), so runs of two versions are never pooled in one control.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoresearch_dagster.outputs.files import json_safe, write_json
from autoresearch_dagster.spec import CampaignBudget

Phase = Literal["measure", "diagnose", "plan", "experiment", "close", "end"]


class CampaignSettings(BaseModel):
    """How a campaign researches (the budget is what it may spend)."""
    model_config = ConfigDict(extra="forbid")
    proposer: Literal["offline", "claude", "both"] = "offline"
    claude_model: str = Field(default="claude-sonnet-4-5", description="model name for the Claude proposer")
    directions_per_round: int = Field(default=4, ge=1, le=4, description="sessions per round, one per direction "
                                      "(4: every direction; the round's slots go to their best predicted ideas)")
    experiments_per_round: int = Field(default=3, ge=1, le=16)
    search_trials: int = Field(default=6, ge=0, le=200, description="surrogate trials per offline session")
    exhausted_after: int = Field(default=2, ge=1, description="a direction whose last N experiments gained "
                                                                 "nothing is set aside")
    diversity_size: int = Field(default=4, ge=0)
    exploit: int = Field(default=2, ge=0, le=8, description="a round whose directions gave nothing with budget left "
                         "proposes up to this many of the calibrated surrogate's best configs whose upper bound "
                         "reaches the verdict margin (agents.orchestrator.exploit_proposals; 0: off)")
    calibrate: bool = Field(default=True, description="fit the surrogate to each baseline's measured curves")
    prescreen: bool = Field(default=False, description="pre-screen candidates on the calibrated emulator and send "
                                                       "only the promising ones to the real engine (agents.prescreen)")
    prescreen_gain: float = Field(default=1.0, ge=0.0, description="promising: a predicted ratio of at least 1 + this "
                                                                   "x the verdict margin")
    prescreen_pool: int = Field(default=2, ge=1, le=8, description="candidates screened per round slot")
    recalibrate_window: int = Field(default=3, ge=1, description="verified experiments the drift rule looks at")
    recalibrate_error: float | None = Field(default=0.10, ge=0.0, description="median |ln(measured / emulated)| "
                                            "ratio error above which the emulator is re-calibrated (None: never)")
    diagnosis_probes: bool = Field(default=True, description="run the one-variable probes in each diagnosis")
    gpu_savings_runs: int = Field(default=3, ge=0, le=20, description="an autoscaled endpoint: demand replays of the "
                                  "original and of the best config each at the end, for the GPUs saved under the real "
                                  "demand curve (0: none)")
    confirm: Literal["fresh_runs", "remeasure"] = Field(
        default="remeasure", description="how a 'better' is confirmed: fresh runs inside the experiment, or the "
                                         "promoted baseline's re-measured noise floor (a gain that does not "
                                         "replicate gets a rollback control)")
    anchor_every: int = Field(default=1, ge=1, description="fresh baseline anchors per this many candidate runs "
                                                             "(benchmarks/bench_verdicts.py: 1 keeps ±5% power >= 90%)")
    drafter: bool = Field(default=False, description="the speculative direction may propose adapting the drafter "
                          "to the endpoint's traffic (campaign.drafter_step: rehearsal, proposal, full training)")
    drafter_variants: int = Field(default=1, ge=0, le=8, description="most drafters one campaign trains "
                                  "(each rehearsal counts)")
    drafter_rehearsal_steps: int = Field(default=40, ge=1, description="head training steps of the rehearsal")
    drafter_rehearsal_requests: int = Field(default=8, ge=1, description="requests per slice the rehearsal measures")
    drafter_min_gain: float = Field(default=1.05, ge=1.0, description="the rehearsal's adapted / starting mean "
                                    "acceptance length on held-out traffic needed for a full training run")
    drafter_train: dict[str, Any] = Field(default_factory=dict, description="drafter.settings.DrafterSettings "
                                          "overrides for rehearsal and full training (steps, target_steps, ...)")
    restart_from: Literal["promoted", "original"] = Field(
        default="promoted", description="what a new campaign starts from when the conditions of an ended one changed "
                                        "(the engine reports a new version, the pool was rebuilt): the previous "
                                        "campaign's best confirmed config, or the spec's server config")
    ablate: bool = Field(default=True, description="before promoting a candidate that changes several knobs of one "
                                                   "direction, measure it without each of them and promote the smallest "
                                                   "set whose gain is within the verdict margin of the full set's")
    seed: int = 0
    budget: CampaignBudget = Field(default_factory=CampaignBudget)


def same_version(a: str | None, b: str | None) -> bool:
    """Two engine versions a campaign treats as one: equal, or either not known (nothing tells them apart)."""
    unknown = (None, "", "unknown")
    return a in unknown or b in unknown or str(a) == str(b)


@dataclass
class Era:
    """One working baseline of the campaign."""
    index: int
    config: dict[str, Any]
    config_hash: str
    reason: str  # original | promotion | rollback | engine_bump
    set_at: str
    source_experiment_id: str | None = None
    delta: dict[str, Any] = field(default_factory=dict)  # change against the previous era
    previous_config: dict[str, Any] | None = None
    noise: dict[str, Any] | None = None  # noise_id, median, ci, cv, capacities, margin, resolved, limiting
    control_run_ids: list[str] = field(default_factory=list)
    hypotheses: list[dict[str, Any]] = field(default_factory=list)
    report_path: str | None = None
    replication: dict[str, Any] | None = None  # a promotion's re-measured gain against the previous era
    rounds: int = 0
    engine_version: str | None = None  # what the engine reported when the era began: its runs are of this version
    ablation: dict[str, Any] | None = None  # a promotion's within-direction ablation (CampaignRunner._ablate)

    @property
    def curve_run_id(self) -> str | None:
        """The noise run whose load curve the era's diagnosis, calibration and grounding read (``capacity.curve_run``);
        eras saved before warm starts kept only their median run."""
        noise = self.noise or {}
        return noise.get("curve_run_id", noise.get("median_run_id"))


@dataclass
class CampaignState:
    campaign_id: str
    endpoint: str
    created_at: str
    settings: dict[str, Any]
    pool_hash: str
    sla: str
    correctness_hash: str
    engine: str
    gpus: int
    origin: str | None = None  # what started it (a Dagster seeding run), so a re-seed starts a new one
    engine_version: str | None = None  # the engine's version when the campaign started (part of its id)
    previous: dict[str, Any] | None = None  # the ended campaign this one succeeded (why, its archive, its best)
    eras: list[Era] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    experiments: list[dict[str, Any]] = field(default_factory=list)
    spent: dict[str, float] = field(default_factory=lambda: {"experiments": 0, "gpu_seconds": 0.0, "wall_s": 0.0})
    direction_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    diversity_pool: list[dict[str, Any]] = field(default_factory=list)
    residuals: list[dict[str, Any]] = field(default_factory=list)
    gate_failures: dict[str, list[str]] = field(default_factory=dict)  # experiment id -> lossy settings that failed
    gate_cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_promotion: dict[str, Any] | None = None
    surrogate: dict[str, Any] = field(default_factory=dict)  # efficiency factors and calibration of the model
    phase: Phase = "measure"
    status: Literal["running", "ended"] = "running"
    ended_because: str | None = None
    ended_at: str | None = None
    open_questions: list[str] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    memory_problems: list[str] = field(default_factory=list)  # rounds whose findings could not be versioned
    drafters: list[dict[str, Any]] = field(default_factory=list)  # drafter rehearsals and trainings (drafter_step)

    @property
    def era(self) -> Era:
        return self.eras[-1]

    @property
    def original(self) -> Era:
        return self.eras[0]

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CampaignState":
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in d.items() if k in known}
        data["eras"] = [Era(**{k: v for k, v in e.items() if k in {f.name for f in fields(Era)}})
                        for e in d.get("eras", [])]
        return cls(**data)

    def save(self, path: str | Path) -> Path:
        return write_json(Path(path), self.to_dict(), sort_keys=True)

    @classmethod
    def load(cls, path: str | Path) -> "CampaignState":
        return cls.from_dict(json.loads(Path(path).read_text()))
