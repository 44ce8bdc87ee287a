"""Owns the four-part proposal schema, the brief a proposer session receives and the session it returns.

A proposal is testable research, in four parts:
- **explanation**: what limits performance, with the evidence the session read;
- **intervention**: a prioritized list of knob changes against the working baseline (SGLang's own
  knob names, ``spec.KNOBS``), or an engine patch;
- **prediction**: the capacity ratio candidate/baseline as a number with an interval, and the latency
  term that should move (relative change at the baseline's capacity rate);
- **falsification**: the outcome that would show the explanation wrong.
It may name controls and follow-ups. Every proposer (offline, Claude, the search baselines) returns
this shape; the orchestrator checks it with the guardrails, and only the orchestrator runs
experiments, through the harness. The same models are the JSON schema the Claude session fills in
(``submit_proposals``), so a malformed answer fails here with a message the session can act on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoresearch_dagster.spec import KNOBS, KNOBS_BY_ENGINE, VLLM_KNOBS, SpecError, config_hash, knobs_for, table_of

DIRECTIONS = ("scheduling_cache", "speculative", "kernels_quant", "parallel_admission")
DIRECTION_NAMES = {"scheduling_cache": "scheduling & cache", "speculative": "speculative decoding",
                   "kernels_quant": "kernels & quantization", "parallel_admission": "parallelism & admission",
                   "control": "controls & ablations"}
Kind = Literal["experiment", "control", "combination", "follow_up"]


class KnobChange(BaseModel):
    """One knob set to one value (``null`` leaves it to the server's own default)."""
    model_config = ConfigDict(extra="forbid")
    knob: str = Field(description="the engine's own knob name (SGLang ServerArgs, vLLM EngineArgs), e.g. "
                                  "chunked_prefill_size")
    value: Any = Field(description="the new value (null: the server's default)")
    why: str = Field(default="", description="what this change does to the bottleneck")

    @model_validator(mode="after")
    def _valid(self) -> "KnobChange":
        """A knob of some engine's table with a value it allows; whether it is the endpoint's engine's
        knob is the guardrails' check (a proposal does not know its endpoint's engine)."""
        tables = [t for t in KNOBS_BY_ENGINE.values() if self.knob in t]
        if not tables:
            raise ValueError(f"unknown knob {self.knob!r}; known knobs: {', '.join(sorted(KNOBS))} "
                             f"(vLLM: {', '.join(sorted(VLLM_KNOBS))})")
        errors = []
        for table in tables:
            try:
                self.value = table[self.knob].validate(self.value)
                return self
            except SpecError as e:
                errors.append(str(e))
        raise ValueError(errors[0])


class EnginePatch(BaseModel):
    """A change to the serving engine's code: tested only where the engine's source can be patched."""
    model_config = ConfigDict(extra="forbid")
    summary: str = Field(min_length=10, description="what the patch changes and why")
    diff: str = Field(default="", description="unified diff against the engine's source")
    target: str = Field(default="sglang", description="the engine the diff applies to")


class Intervention(BaseModel):
    model_config = ConfigDict(extra="forbid")
    changes: list[KnobChange] = Field(default_factory=list,
                                      description="config changes, most important first")
    patch: EnginePatch | None = None
    justification: str = Field(default="", description="why a numeric knob may move further than the "
                                                       "guardrail's maximum step (evidence, not hope)")

    @model_validator(mode="after")
    def _not_empty(self) -> "Intervention":
        if not self.changes and self.patch is None:
            raise ValueError("an intervention needs at least one knob change or an engine patch")
        names = [c.knob for c in self.changes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"an intervention sets each knob once; repeated: {dupes}")
        return self

    def delta(self) -> dict[str, Any]:
        """The knob changes as a config mapping."""
        return {c.knob: c.value for c in self.changes}


class LatencyTerm(BaseModel):
    """A latency quantile the intervention should move, at the baseline's capacity rate."""
    model_config = ConfigDict(extra="forbid")
    metric: Literal["ttft", "itl", "tpot", "e2e"]
    quantile: float = Field(default=99.0, gt=0, lt=100)
    change: float = Field(description="relative change, e.g. -0.25 for 25% lower", gt=-1.0)


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: Literal["capacity_ratio"] = "capacity_ratio"
    capacity_ratio: float = Field(gt=0, description="predicted median capacity ratio candidate/baseline")
    ratio_low: float = Field(gt=0, description="lower end of the prediction interval")
    ratio_high: float = Field(gt=0, description="upper end of the prediction interval")
    confidence: float = Field(default=0.8, gt=0, lt=1, description="coverage the interval claims")
    latency: list[LatencyTerm] = Field(default_factory=list, description="latency terms that should move")
    basis: str = Field(min_length=3, description="where the numbers come from (model, evidence)")

    @model_validator(mode="after")
    def _ordered(self) -> "Prediction":
        if not self.ratio_low <= self.capacity_ratio <= self.ratio_high:
            raise ValueError(f"the interval [{self.ratio_low}, {self.ratio_high}] must contain the predicted "
                             f"ratio {self.capacity_ratio}")
        return self

    @property
    def direction(self) -> str:
        """up | down | flat: where the predicted interval lies against 1."""
        if self.ratio_low > 1.0:
            return "up"
        if self.ratio_high < 1.0:
            return "down"
        return "flat"


class Proposal(BaseModel):
    """One testable idea; ``candidate_config`` and ``guardrail_notes`` are set by the orchestrator."""
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[A-Za-z0-9_.:=+-]{1,120}$")
    endpoint: str
    campaign_id: str | None = None
    round: int = 0
    proposer: str = Field(description="offline | claude | random | tpe | orchestrator")
    source: str = Field(description="recipe name, search, model name, ablation, ...")
    direction: str
    kind: Kind = "experiment"
    question: str = ""
    explanation: str = Field(min_length=10)
    evidence: list[str] = Field(default_factory=list)
    intervention: Intervention
    prediction: Prediction
    falsification: str = Field(min_length=10)
    controls: list[str] = Field(default_factory=list)
    follow_ups: list[str] = Field(default_factory=list)
    trace: str | None = Field(default=None, description="path of the session transcript / reasoning trace")
    candidate_config: dict[str, Any] = Field(default_factory=dict)
    guardrail_notes: list[str] = Field(default_factory=list)
    parent_ids: list[str] = Field(default_factory=list, description="proposals this one combines or controls")

    @field_validator("direction")
    @classmethod
    def _direction(cls, v: str) -> str:
        if v not in DIRECTIONS and v != "control":
            raise ValueError(f"direction {v!r} is not one of {', '.join(DIRECTIONS)} (or control)")
        return v

    @property
    def config_hash(self) -> str:
        return config_hash(self.candidate_config)

    @property
    def is_patch(self) -> bool:
        return self.intervention.patch is not None


class ResearchBrief(BaseModel):
    """What one proposer session is given: the campaign's facts and one research question."""
    model_config = ConfigDict(extra="forbid")
    campaign_id: str
    round: int
    endpoint: str
    model: str
    gpu: str
    gpus: int
    engine: str
    sla: str
    pool_id: str
    baseline_config: dict[str, Any]
    baseline_hash: str
    resolved_baseline: dict[str, Any] = Field(default_factory=dict, description="every knob's resolved value")
    baseline: dict[str, Any] = Field(default_factory=dict, description="capacity median, CI, limiting SLA term")
    noise: dict[str, Any] = Field(default_factory=dict, description="run-level CV, runs, verdict margin")
    experiment_ids: list[str] = Field(default_factory=list)
    history: list[dict[str, Any]] = Field(default_factory=list, description="this campaign's tested changes")
    prior_findings: list[dict[str, Any]] = Field(default_factory=list, description="memory: similar endpoints")
    direction: str
    question: str
    hypotheses: list[dict[str, Any]] = Field(default_factory=list, description="the report's ranked bottlenecks")
    max_proposals: int = 3
    guardrails: dict[str, Any] = Field(default_factory=dict)
    tested_configs: dict[str, str] = Field(default_factory=dict, description="candidate config hash -> why it is "
                                                                               "not tested again")
    gate_failures: list[list[str]] = Field(default_factory=list, description="sets of lossy settings (knob=value) "
                                                                              "that failed the correctness gate")
    seed: int = 0


@dataclass
class Session:
    """One proposer session's outcome: its proposals, the trace behind them, what went wrong."""
    proposer: str
    direction: str
    proposals: list[Proposal] = field(default_factory=list)
    trace: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    trace_path: str | None = None


def lossy_settings(config: dict[str, Any], engine: str | None = None) -> list[str]:
    """The config's lossy settings as ``knob=value`` (canonical values, the engine's knob table; None: the
    table that has the config's knobs, ``spec.table_of``)."""
    table = table_of(config, engine=engine)
    return sorted(f"{k}={table[k].canonical(v)}" for k, v in config.items() if table[k].meaning(v).lossy)


def new_lossy(config: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """The lossy settings a candidate stakes beyond its baseline's own: what the correctness gate judges."""
    return sorted(set(lossy_settings(config)) - set(lossy_settings(baseline)))


def stakes_too_much(config: dict[str, Any], baseline: dict[str, Any]) -> str | None:
    """Why a candidate stakes more than one new lossy setting at once (a gate failure would not say which
    of them changed the outputs), else None."""
    mine = new_lossy(config, baseline)
    if len(mine) > 1:
        return (f"stakes {len(mine)} new lossy settings at once ({', '.join(mine)}): a correctness-gate failure "
                "would not say which; one at a time")
    return None


def fails_gate(config: dict[str, Any], baseline: dict[str, Any], failures: list[list[str]]) -> list[str] | None:
    """The failed set of lossy settings this config repeats (beyond the baseline's own), else None."""
    mine = set(new_lossy(config, baseline))
    for failed in failures:
        if failed and set(failed) <= mine:
            return failed
    return None


class Proposer(Protocol):
    """A source of proposals; ``propose`` must not run experiments (only the orchestrator does)."""
    name: str

    def propose(self, brief: ResearchBrief, tools: Any) -> Session: ...
