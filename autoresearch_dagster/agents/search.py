"""Owns the knob search space and the model-based search over it (Optuna's TPE sampler).

The space derives from the endpoint's engine's knob table (``spec.knobs_for``: SGLang's ``KNOBS``,
vLLM's ``VLLM_KNOBS``): every knob with search values, categorical (Optuna handles booleans, strings,
None and ordered numbers alike as choices), plus the parallel degrees (``tp_size``/``dp_size``,
``tensor_parallel_size``) over the choices the endpoint's GPUs allow. ``SearchSpace.around`` narrows it to some knobs and to numeric
values within a step factor of the baseline's resolved values (the guardrails' step limit).

Why Optuna TPE: it is well kept, handles categorical and conditional spaces without encoding
tricks, supports ask/tell (so a batch of candidates can be evaluated in parallel, with the constant
liar keeping a batch diverse), takes trials measured elsewhere (``add_trial``: the campaign's
verdicts seed it) and learns infeasible regions from constraint values instead of retrying them.
A GP would model the few measured points better but needs a numeric encoding of every categorical
knob; the surrogate already supplies the smoothness TPE lacks.
"""
from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from autoresearch_dagster.spec import KNOBS, config_hash, knobs_for, server_overrides, validate_server_config

SPECULATIVE_PARAMS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                      "speculative_draft_model_path")
PARALLEL_KNOBS = ("tp_size", "dp_size", "tensor_parallel_size")  # their product is the GPUs a config asks for


def _optuna():
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    return optuna


def _numeric(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class SearchSpace:
    """knob -> the values the search may set (each tuple includes the baseline's own value); ``engine``
    names the knob table (``spec.knobs_for``)."""
    choices: dict[str, tuple]
    engine: str = "sglang"

    @classmethod
    def full(cls, gpus: int, baseline: dict[str, Any] | None = None, engine: str = "sglang",
             traits: frozenset[str] = frozenset()) -> "SearchSpace":
        """Every knob with search values, at those values; parallel degrees at the choices that fit ``gpus``; a
        model-specific knob (``Knob.model_trait``) only when the model has its trait (``traits``: ``ModelCard.traits``)."""
        base = baseline or {}
        out: dict[str, tuple] = {}
        for name, k in knobs_for(engine).items():
            if k.model_trait is not None and k.model_trait not in traits:
                continue
            if name in PARALLEL_KNOBS:
                vals = tuple(v for v in (k.choices or ()) if v <= gpus)
            else:
                vals = tuple(k.search_values)
            if not vals:
                continue
            current = base.get(name, k.default)
            if all(k.canonical(v) != k.canonical(current) for v in vals):
                vals = (current,) + vals
            if len(vals) > 1:
                out[name] = vals
        return cls(out, engine)

    def around(self, knobs: list[str] | None, resolved: dict[str, Any], *, max_step: float) -> "SearchSpace":
        """Only ``knobs`` (all when None), numeric values within ``max_step`` x of the resolved value."""
        out: dict[str, tuple] = {}
        for name, vals in self.choices.items():
            if knobs is not None and name not in knobs:
                continue
            cur = resolved.get(name)
            keep = []
            for v in vals:
                if _numeric(v) and _numeric(cur) and v > 0 and cur > 0 and max(v / cur, cur / v) > max_step + 1e-9:
                    continue
                keep.append(v)
            if len(keep) > 1:
                out[name] = tuple(keep)
        return SearchSpace(out, self.engine)

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.choices.values())

    def distributions(self) -> dict[str, Any]:
        optuna = _optuna()
        return {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in self.choices.items()}

    def config(self, params: dict[str, Any], base: dict[str, Any],
               resolved: dict[str, Any] | None = None) -> dict[str, Any]:
        """The server config these search parameters give on top of ``base`` (see ``normalize``)."""
        return normalize({**base, **params}, base, resolved, self.engine)

    def params_of(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The search parameters of a config when every searched knob's value is a choice, else None."""
        out = {}
        table = knobs_for(self.engine)
        for name, vals in self.choices.items():
            v = config.get(name, table[name].default)
            match = [c for c in vals if table[name].canonical(c) == table[name].canonical(v)]
            if not match:
                return None
            out[name] = match[0]
        return out

    def sample(self, rng: random.Random, base: dict[str, Any], resolved: dict[str, Any] | None = None) -> dict[str, Any]:
        """A uniformly random config of the space (the random-search baseline)."""
        return self.config({k: rng.choice(v) for k, v in self.choices.items()}, base, resolved)


def normalize(config: dict[str, Any], base: dict[str, Any], resolved: dict[str, Any] | None = None,
              engine: str = "sglang") -> dict[str, Any]:
    """A config in its shortest form: unset values dropped, speculative parameters only with a
    speculative algorithm, and a knob the baseline leaves unset dropped when the config sets it to the
    value the server resolves anyway (so one configuration has one hash)."""
    resolved = resolved or {}
    table = knobs_for(engine)
    cfg = dict(config)
    if cfg.get("speculative_algorithm") is None:
        for k in SPECULATIVE_PARAMS:
            cfg.pop(k, None)
    out = {}
    for k, v in cfg.items():
        if v is None:
            continue
        if k not in base:
            default = resolved.get(k, table[k].default)
            if table[k].canonical(v) == table[k].canonical(default):
                continue
        out[k] = v
    return validate_server_config(out, engine)


def static_problem(config: dict[str, Any], gpus: int, engine: str = "sglang") -> str | None:
    """Why a config cannot run at all, knowable without an engine (None: it may run)."""
    if knobs_for(engine) is not KNOBS:
        tp = config.get("tensor_parallel_size", 1)
        return f"tensor_parallel_size = {tp} exceeds {gpus} GPU(s)" if tp > gpus else None
    tp, dp = config.get("tp_size", 1), config.get("dp_size", 1)
    if tp * dp > gpus:
        return f"tp_size x dp_size = {tp * dp} exceeds {gpus} GPU(s)"
    overridden = {k for k, v in server_overrides(config).items()
                  if KNOBS[k].canonical(config.get(k)) != KNOBS[k].canonical(v)}
    if overridden:
        return f"SGLang would override {', '.join(sorted(overridden))} (config drift)"
    return None


@dataclass
class Trial:
    config: dict[str, Any]
    value: float | None  # the objective (None: infeasible)
    source: str  # seed | history | tpe
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "config_hash": config_hash(self.config), "value": self.value,
                "source": self.source, "note": self.note}


@dataclass
class TPE:
    """A TPE study over a space, driven by ask/tell: ``ask`` proposes configs, ``tell`` gives values."""
    space: SearchSpace
    base: dict[str, Any]
    seed: int = 0
    resolved: dict[str, Any] = field(default_factory=dict)
    n_startup_trials: int = 4
    trials: list[Trial] = field(default_factory=list)

    def __post_init__(self) -> None:
        optuna = _optuna()
        self._optuna = optuna
        self.study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
            seed=self.seed, n_startup_trials=self.n_startup_trials, multivariate=True, constant_liar=True))
        self._pending: dict[str, Any] = {}

    def add(self, config: dict[str, Any], value: float | None, source: str, note: str = "") -> None:
        """A trial measured elsewhere (a seed evaluated by the caller, a campaign verdict)."""
        params = self.space.params_of(config)
        self.trials.append(Trial(config, value, source, note))
        if params is None:
            return  # outside this space: kept in the trace, not in the study
        dist = self.space.distributions()
        self.study.add_trial(self._optuna.trial.create_trial(
            params=params, distributions=dist, value=value if value is not None else 0.0))

    def ask(self, n: int, *, exclude: set[str] = frozenset(), max_tries: int = 50) -> list[tuple[Any, dict]]:
        """Up to ``n`` new configs (not in ``exclude`` nor asked before) with their open Optuna trials."""
        out: list[tuple[Any, dict]] = []
        seen = set(exclude) | {config_hash(t.config) for t in self.trials}
        dist = self.space.distributions()
        for _ in range(max_tries):
            if len(out) >= n:
                break
            trial = self.study.ask(dist)
            cfg = self.space.config(trial.params, self.base, self.resolved)
            h = config_hash(cfg)
            if h in seen:
                # a duplicate teaches nothing new: close it with the value already known
                known = next((t.value for t in self.trials if config_hash(t.config) == h), None)
                self.study.tell(trial, known if known is not None else 0.0)
                continue
            seen.add(h)
            out.append((trial, cfg))
        return out

    def tell(self, trial: Any, config: dict[str, Any], value: float | None, note: str = "") -> None:
        self.study.tell(trial, value if value is not None else 0.0)
        self.trials.append(Trial(config, value, "tpe", note))


def search(space: SearchSpace, base: dict[str, Any], objective: Callable[[list[dict[str, Any]]], list[tuple[float | None, str]]],
           *, seeds: list[tuple[dict[str, Any], str]], history: list[tuple[dict[str, Any], float]], n_trials: int,
           batch: int = 2, seed: int = 0, exclude: set[str] = frozenset(),
           resolved: dict[str, Any] | None = None) -> TPE:
    """Model-based search seeded by ``seeds`` (configs the recipes chose, evaluated first) and
    ``history`` (configs with measured objective values), then ``n_trials`` TPE proposals evaluated
    ``batch`` at a time by ``objective`` (values, None for infeasible, with a note)."""
    tpe = TPE(space, base, seed=seed, resolved=dict(resolved or {}))
    for cfg, value in history:
        tpe.add(cfg, value, "history")
    if seeds:
        values = objective([c for c, _ in seeds])
        for (cfg, label), (v, note) in zip(seeds, values):
            tpe.add(cfg, v, "seed", f"{label}; {note}".strip("; "))
    left = n_trials
    while left > 0:
        asked = tpe.ask(min(batch, left), exclude=exclude)
        if not asked:
            break
        values = objective([c for _, c in asked])
        for (trial, cfg), (v, note) in zip(asked, values):
            tpe.tell(trial, cfg, v, note)
        left -= len(asked)
    return tpe
