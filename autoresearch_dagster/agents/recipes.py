"""Owns the offline proposer's recipes: diagnosed bottlenecks mapped to knob moves, one YAML file each.

A recipe (``agents/recipes/*.yaml``, extendable with more directories like the probe recipes) names
the research direction it belongs to, the bottlenecks it addresses (``diagnose.hypotheses``), an
explanation, a falsification, the latency term it should move, and its moves. A move is one
candidate: knob -> value, where a value may also be relative to the knob's resolved baseline value:
``next_up`` / ``next_down`` (the neighbouring search value in the knob table), ``double`` / ``half``
(clamped to the knob's bounds). ``requires: {min_gpus: N}`` skips a recipe on smaller deployments,
``requires: {model_trait: T}`` on models without trait T (``ModelCard.traits``: ``linear_attention``).
``engine: vllm`` makes a recipe's knobs vLLM's (``spec.VLLM_KNOBS``); without it they are SGLang's, and a
recipe serves only endpoints whose engine reads its table (``spec.knob_table``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autoresearch_dagster.agents.proposal import DIRECTIONS
from autoresearch_dagster.diagnose.hypotheses import BOTTLENECKS
from autoresearch_dagster.emulator.card import ModelCard
from autoresearch_dagster.spec import KNOBS_BY_ENGINE, SpecError, knobs_for

RECIPE_DIR = Path(__file__).parent / "recipes"
RELATIVE = ("next_up", "next_down", "double", "half")


@dataclass(frozen=True)
class Recipe:
    name: str
    direction: str
    addresses: tuple[str, ...]
    explanation: str
    falsification: str
    moves: tuple[dict[str, Any], ...]
    latency_metric: str = "tpot"
    latency_sign: int = -1
    min_gpus: int = 1
    path: str = ""
    engine: str = "sglang"  # the knob table its moves use (KNOBS_BY_ENGINE)
    model_trait: str | None = None  # serves only models with this trait (ModelCard.traits)

    def relevance(self, scores: dict[str, float]) -> float:
        """How strongly the diagnosis points at this recipe: its best-scored addressed bottleneck."""
        return max((scores.get(b, 0.0) for b in self.addresses), default=0.0)


@dataclass
class Move:
    recipe: Recipe
    index: int
    delta: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.recipe.name}#{self.index}"


def _parse(path: Path) -> Recipe:
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"recipe {path}: not valid YAML: {e}") from None
    if not isinstance(d, dict):
        raise SpecError(f"recipe {path}: must be a mapping")
    missing = [k for k in ("name", "direction", "addresses", "explanation", "falsification", "moves") if not d.get(k)]
    if missing:
        raise SpecError(f"recipe {path}: missing {', '.join(missing)}")
    if d["direction"] not in DIRECTIONS:
        raise SpecError(f"recipe {path}: direction {d['direction']!r} is not one of {', '.join(DIRECTIONS)}")
    engine = str(d.get("engine", "sglang"))
    if engine not in KNOBS_BY_ENGINE:
        raise SpecError(f"recipe {path}: engine {engine!r} is not one of {', '.join(KNOBS_BY_ENGINE)}")
    table = KNOBS_BY_ENGINE[engine]
    unknown = [b for b in d["addresses"] if b not in BOTTLENECKS]
    if unknown:
        raise SpecError(f"recipe {path}: unknown bottlenecks {unknown}; known: {', '.join(BOTTLENECKS)}")
    for move in d["moves"]:
        if not isinstance(move, dict) or not move:
            raise SpecError(f"recipe {path}: each move is a non-empty mapping of knob -> value")
        for k, v in move.items():
            if k not in table:
                raise SpecError(f"recipe {path}: unknown {engine} knob {k!r}")
            if not (isinstance(v, str) and v in RELATIVE):
                table[k].validate(v)
    trait = (d.get("requires") or {}).get("model_trait")
    if trait is not None and trait not in ModelCard.TRAITS:
        raise SpecError(f"recipe {path}: unknown model_trait {trait!r}; known: {', '.join(ModelCard.TRAITS)}")
    lat = d.get("latency") or {}
    return Recipe(name=str(d["name"]), direction=d["direction"], addresses=tuple(d["addresses"]),
                  explanation=" ".join(str(d["explanation"]).split()),
                  falsification=" ".join(str(d["falsification"]).split()), moves=tuple(d["moves"]),
                  latency_metric=str(lat.get("metric", "tpot")), latency_sign=int(lat.get("sign", -1)),
                  min_gpus=int((d.get("requires") or {}).get("min_gpus", 1)), path=str(path), engine=engine,
                  model_trait=trait)


def load_recipes(extra_dirs: list[str | Path] | None = None) -> list[Recipe]:
    """Every recipe in the built-in directory and ``extra_dirs``; names must be unique."""
    out: dict[str, Recipe] = {}
    for d in [RECIPE_DIR, *(Path(x) for x in extra_dirs or [])]:
        for p in sorted(Path(d).glob("*.yaml")):
            r = _parse(p)
            if r.name in out:
                raise SpecError(f"recipe name {r.name!r} is defined twice ({out[r.name].path}, {p})")
            out[r.name] = r
    return list(out.values())


def relative_value(name: str, op: str, current: Any, engine: str = "sglang") -> Any:
    """The value ``op`` gives for knob ``name`` from its resolved ``current`` value (None: no such value)."""
    k = knobs_for(engine)[name]
    if op in ("double", "half"):
        if not isinstance(current, (int, float)) or isinstance(current, bool) or current <= 0:
            return None
        v = current * 2 if op == "double" else current / 2
        v = int(round(v)) if k.type is int else float(v)
        if k.low is not None:
            v = max(v, k.low)
        if k.high is not None:
            v = min(v, k.high)
        return v if v != current else None
    values = sorted(v for v in k.search_values if isinstance(v, (int, float)) and not isinstance(v, bool))
    if not values:
        return None
    cur = current if isinstance(current, (int, float)) and not isinstance(current, bool) else None
    if op == "next_up":
        above = [v for v in values if cur is None or v > cur]
        return above[0] if above else None
    below = [v for v in values if cur is not None and v < cur]
    return below[-1] if below else None


def resolve_move(recipe: Recipe, index: int, resolved: dict[str, Any]) -> Move | None:
    """The move's knob changes against the resolved baseline values; None when a relative step has no
    value left to take or the move changes nothing."""
    move = recipe.moves[index]
    table = KNOBS_BY_ENGINE[recipe.engine]
    delta: dict[str, Any] = {}
    notes: list[str] = []
    for name, v in move.items():
        current = resolved.get(name, table[name].default)
        if isinstance(v, str) and v in RELATIVE:
            nv = relative_value(name, v, current, recipe.engine)
            if nv is None:
                return None
            notes.append(f"{name}: {v} of {current} -> {nv}")
            v = nv
        if table[name].canonical(v) != table[name].canonical(current):
            delta[name] = v
    return Move(recipe, index, delta, notes) if delta else None
