"""Owns the guardrails every proposal passes before the harness may run it, whoever proposed it.

Knob names, types, bounds and allowed values come from the endpoint's engine's knob table
(``Guardrails.engine``; ``spec.knobs_for``: SGLang's ``KNOBS`` or vLLM's ``VLLM_KNOBS``). On top: a numeric knob moves by at most ``max_numeric_step`` (a factor, against its resolved
value on the baseline) unless the proposal's intervention gives a justification, and then by at
most ``justified_step``; no more than ``max_changes`` knobs at once; locked knobs stay as they are;
an endpoint that is lossless only takes no lossy change; the GPUs the config asks for (``tp_size`` x
``dp_size``) fit the deployment (or the operator's ``max_gpus``; ``for_endpoint`` reads the spec's limits); speculative parameters
need a speculative algorithm; a combination SGLang would silently override (``spec.server_overrides``)
is refused, because it would only show up as config drift; and a candidate equal to the baseline is
not an experiment. An engine patch keeps the baseline's config and is marked as a patch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autoresearch_dagster.agents.proposal import Proposal, lossy_settings
from autoresearch_dagster.spec import (KNOBS, EndpointSpec, SpecError, config_hash, knobs_for, server_overrides,
                                       validate_server_config)

SPECULATIVE_PARAMS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                      "speculative_draft_model_path")
MIN_JUSTIFICATION_CHARS = 20


@dataclass(frozen=True)
class Guardrails:
    gpus: int
    max_numeric_step: float = 2.0
    justified_step: float = 8.0
    max_changes: int = 4
    locked: tuple[str, ...] = ()
    engine: str = "sglang"  # the endpoint's engine: which knob table proposals are checked against
    lossless_only: bool = False

    @classmethod
    def for_endpoint(cls, endpoint: EndpointSpec) -> "Guardrails":
        """The endpoint's guardrails: its engine, its GPUs and the operator's limits in its spec."""
        g = endpoint.guardrails
        return cls(gpus=endpoint.max_candidate_gpus, engine=endpoint.engine, locked=tuple(g.locked_knobs),
                   lossless_only=g.lossless_only)

    def describe(self) -> dict[str, Any]:
        """What a proposer is told about the limits."""
        return {**asdict(self), "rule": (
            f"numeric knobs move by at most x{self.max_numeric_step:g} of their resolved baseline value "
            f"(x{self.justified_step:g} with a justification in the intervention); at most {self.max_changes} "
            f"knobs per proposal; tp_size x dp_size <= {self.gpus} GPUs; locked knobs: "
            f"{', '.join(self.locked) or 'none'}" + ("; lossless changes only" if self.lossless_only else ""))}


@dataclass
class GuardrailResult:
    accepted: bool
    candidate_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def resolved_config(server_info: dict[str, Any] | None, engine: str = "sglang") -> dict[str, Any]:
    """Every knob of the engine's table a server reported (``/server_info``, flat or under ``server_args``)."""
    info = server_info or {}
    src = info.get("server_args", info) if isinstance(info, dict) else {}
    return {k: src[k] for k in knobs_for(engine) if k in src}


def _numeric(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _step_reason(name: str, old: Any, new: Any, proposal: Proposal, g: Guardrails) -> tuple[str | None, str | None]:
    """(refusal, note) for one numeric change."""
    if not (_numeric(old) and _numeric(new)) or old <= 0 or new <= 0:
        return None, None  # switching a feature on or off (0, -1, unset) is not a step along a scale
    factor = max(new / old, old / new)
    if factor <= g.max_numeric_step * (1 + 1e-9):
        return None, None
    justified = len(proposal.intervention.justification.strip()) >= MIN_JUSTIFICATION_CHARS
    if justified and factor <= g.justified_step * (1 + 1e-9):
        return None, f"{name}: x{factor:.2g} step beyond x{g.max_numeric_step:g}, justified: " \
                     f"{proposal.intervention.justification.strip()[:200]}"
    limit = g.justified_step if justified else g.max_numeric_step
    return (f"{name}: {old} -> {new} is a x{factor:.2g} step, above the x{limit:g} limit"
            + ("" if justified else " (an intervention justification allows up to "
               f"x{g.justified_step:g})")), None


def check(proposal: Proposal, baseline_config: dict[str, Any], resolved: dict[str, Any],
          g: Guardrails) -> GuardrailResult:
    """Whether ``proposal`` may run against ``baseline_config`` (``resolved``: every knob's value on the
    baseline as the server resolved it), and the candidate config it runs with."""
    reasons: list[str] = []
    notes: list[str] = []
    table = knobs_for(g.engine)
    base = dict(baseline_config)
    if proposal.is_patch:
        notes.append(f"engine patch: {proposal.intervention.patch.summary[:200]}")
    delta = proposal.intervention.delta()
    for name in delta:
        if name in g.locked:
            reasons.append(f"{name} is locked by the endpoint's guardrails")
    if len(delta) > g.max_changes:
        reasons.append(f"{len(delta)} knob changes in one proposal; at most {g.max_changes}")
    unknown = [n for n in delta if n not in table]
    if unknown:
        return GuardrailResult(False, {}, notes, reasons + [
            f"{', '.join(unknown)}: not {g.engine}'s knob(s); this endpoint's engine takes {', '.join(sorted(table))}"])
    for name, new in delta.items():
        old = resolved.get(name, base.get(name, table[name].default))
        refusal, note = _step_reason(name, old, new, proposal, g)
        if refusal:
            reasons.append(refusal)
        if note:
            notes.append(note)
    merged = {**base, **delta}
    try:
        candidate = validate_server_config({k: v for k, v in merged.items() if v is not None}, g.engine)
    except SpecError as e:
        return GuardrailResult(False, {}, notes, reasons + [str(e)])
    lossy = sorted(set(lossy_settings(candidate, g.engine)) - set(lossy_settings(base, g.engine)))
    if g.lossless_only and lossy:
        reasons.append(f"{', '.join(lossy)}: lossy, and the endpoint's guardrails allow lossless changes only")
    if table is not KNOBS:  # vLLM: one parallel degree, no SGLang resolution rules
        tp = candidate.get("tensor_parallel_size", 1)
        if tp > g.gpus:
            reasons.append(f"tensor_parallel_size = {tp} exceeds the deployment's {g.gpus} GPU(s)")
        if not proposal.is_patch and config_hash(candidate) == config_hash(base):
            reasons.append("the candidate equals the baseline: nothing to test")
        return GuardrailResult(not reasons, candidate, notes, reasons)
    tp = candidate.get("tp_size", KNOBS["tp_size"].default)
    dp = candidate.get("dp_size", KNOBS["dp_size"].default)
    if tp * dp > g.gpus:
        reasons.append(f"tp_size x dp_size = {tp * dp} exceeds the deployment's {g.gpus} GPU(s)")
    if candidate.get("speculative_algorithm") is None:
        stray = [k for k in SPECULATIVE_PARAMS if candidate.get(k) is not None]
        if stray:
            reasons.append(f"{', '.join(stray)} set without a speculative_algorithm")
    overridden = {k: v for k, v in server_overrides(candidate).items() if candidate.get(k) != v
                  and KNOBS[k].canonical(candidate.get(k)) != KNOBS[k].canonical(v)}
    if overridden:
        reasons.append(f"SGLang would override {', '.join(f'{k} -> {v!r}' for k, v in overridden.items())} "
                       "under this combination (config drift)")
    if not proposal.is_patch and config_hash(candidate) == config_hash(base):
        reasons.append("the candidate equals the baseline: nothing to test")
    return GuardrailResult(not reasons, candidate, notes, reasons)
