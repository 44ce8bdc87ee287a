"""Owns the read-only tools a proposer session may call: the round's evidence as data, nothing else.

Each tool has a name, a description, a JSON schema for its input and a pure function over data the
orchestrator gathered before the round (the diagnostic report and its plots' data, the profile
breakdown, the baseline's load curve, memory queries, this campaign's experiment history, the SGLang
knob reference from the endpoint engine's table, ``spec.knobs_for``). No tool runs a command, reads a path the session names or
writes anything: what a session reads from logs or memory is data, and its answers can only be
proposals, which the guardrails check.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from autoresearch_dagster.spec import knob_table, knobs_for

ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}  # by knob table (spec.knob_table)

MAX_RESULT_CHARS = 20_000


def knob_reference(direction: str | None = None, engine: str = "sglang") -> list[dict[str, Any]]:
    """Every tunable knob of ``engine`` (its own names: SGLang's ServerArgs or vLLM's EngineArgs) with type,
    bounds, choices, lossy values and trade-off."""
    out = []
    for k in knobs_for(engine).values():
        if direction and k.direction != direction:
            continue
        out.append({"knob": k.name, "flag": k.flag, "type": k.type.__name__, "default": k.default,
                    "direction": k.direction, "choices": list(k.choices) if k.choices else None,
                    "low": k.low, "high": k.high, "search_values": list(k.search_values),
                    "lossy_values": sorted(str(v) for v, m in k.meanings.items() if m.lossy), "tradeoff": k.tradeoff,
                    "only_for_models_with": k.model_trait})
    return out


@dataclass
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[..., Any]

    def spec(self) -> dict[str, Any]:
        """The Messages API tool definition."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


@dataclass
class ToolBox:
    """The data of one round, exposed as read-only tools."""
    report: dict[str, Any] = field(default_factory=dict)
    load_curve: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    memory_query: Callable[[str | None], list[dict[str, Any]]] | None = None
    engine: str = "sglang"  # the endpoint's engine: whose knobs the reference lists

    def tools(self) -> list[Tool]:
        obj = {"type": "object", "properties": {}, "additionalProperties": False}
        return [
            Tool("get_diagnostic_report", "The diagnosis of the working baseline: ranked bottleneck hypotheses with "
                 "their evidence, findings, and the measured features they were scored on.", obj,
                 lambda: {k: self.report.get(k) for k in ("hypotheses", "findings", "features", "meta")}),
            Tool("get_profile_breakdown", "The GPU profile of the baseline at its break point: time per kernel class, "
                 "prefill/decode share, launch gaps, decode stalls (what the plots of the report show).", obj,
                 lambda: (self.report.get("details") or {}).get("profile") or {"note": "no profile in this report"}),
            Tool("get_load_curve", "The baseline's measured load steps: rate, achieved throughput, p50/p99 latencies, "
                 "SLA pass/fail per step (the data of the load-curve plot).", obj, lambda: self.load_curve),
            Tool("get_experiment_history", "Every experiment of this campaign so far: the change, the baseline it was "
                 "tested against, the prediction made, the verdict and the measured ratio with its interval.", obj,
                 lambda: self.history),
            Tool("query_memory", "Findings from earlier campaigns on similar endpoints, grouped by technique, with "
                 "their outcomes side by side (disagreements kept). Optional filter: a knob name.",
                 {"type": "object", "properties": {"knob": {"type": "string", "description": "only techniques "
                                                            "that change this knob"}}, "additionalProperties": False},
                 lambda knob=None: self.memory_query(knob) if self.memory_query else []),
            Tool("get_knob_reference", f"{ENGINE_NAMES.get(knob_table(self.engine))} server knobs this campaign may "
                 "change: type, bounds, choices, lossy values, the research direction and the trade-off of each. "
                 "Optional filter: a direction.",
                 {"type": "object", "properties": {"direction": {"type": "string", "enum": sorted(
                     {k.direction for k in knobs_for(self.engine).values()})}}, "additionalProperties": False},
                 lambda direction=None: knob_reference(direction, self.engine)),
        ]

    def call(self, name: str, arguments: dict[str, Any] | None) -> str:
        """Run one tool; the result as JSON text (truncated), or an error message the session can read."""
        tools = {t.name: t for t in self.tools()}
        if name not in tools:
            return json.dumps({"error": f"unknown tool {name!r}; tools: {', '.join(tools)}"})
        try:
            out = tools[name].fn(**(arguments or {}))
        except TypeError as e:
            return json.dumps({"error": f"bad arguments for {name}: {e}"})
        except Exception as e:  # noqa: BLE001 -- a tool that fails answers with the error, never crashes the session
            return json.dumps({"error": f"{name} failed: {type(e).__name__}: {e}"[:500]})
        text = json.dumps(out, default=str, sort_keys=True)
        return text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + "... [truncated]"
