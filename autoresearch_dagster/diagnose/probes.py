"""Owns diagnostic probes: recipe loading, pool transforms, running variants through the runner, the probe memory.

A probe is a one-variable workload derived from the replay pool (longer prompts, longer outputs,
shared or unique prefixes, injected long prompts, bursty arrivals, rising load), run through the
runner's own step (``measure.step.poisson_step``, with the profile's request timeout), and reduced
to one number (an elasticity, a ratio or a difference between variants). Recipes are YAML files,
one per probe, read from this package's ``probes/`` folder and from user folders
(``AUTORESEARCH_PROBES_DIR`` or ``extra_dirs``); a recipe's ``supports:`` list says which
bottleneck hypothesis its number supports and at what values, so adding a probe needs no code.
Which probes proved useful for which endpoint traits is appended to a JSONL memory file.
"""
from __future__ import annotations

import json
import math
import os
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from autoresearch_dagster.diagnose.metrics import analyze_timeseries
from autoresearch_dagster.loadgen.prometheus import snapshot
from autoresearch_dagster.outputs.files import atomic_write_text
from autoresearch_dagster.spec import SLA, SpecError
from autoresearch_dagster.tokens import block_hashes, count_tokens, render_prompt, synth_text

PACKAGE_DIR = Path(__file__).parent / "probes"
SIGNAL_KINDS = ("elasticity", "ratio", "diff", "last")
_RECIPE_KEYS = {"name", "suspect", "description", "variants", "load", "signals", "quick"}
_SIGNAL_KEYS = {"key", "y", "x", "kind", "label", "supports"}


@dataclass
class ProbeRecipe:
    name: str
    suspect: str
    description: str
    variants: list[dict]  # {name, transforms: [{op, ...}], load: {...} (overrides), x: float (optional)}
    load: dict  # rate_fraction (of capacity) | rate_rps, requests, burstiness
    signals: list[dict]  # {key, y: "ttft_ms.p50" | "engine.token_usage_max", x, kind, label, supports: [...]}
    quick: bool
    path: str

    def feature(self, key: str) -> str:
        return f"probe.{self.name}.{key}"


def _check_recipe(data: Any, path: Path) -> ProbeRecipe:
    from autoresearch_dagster.diagnose.hypotheses import BOTTLENECKS

    where = f"probe recipe {path}"
    if not isinstance(data, dict):
        raise SpecError(f"{where} must be a mapping")
    unknown = set(data) - _RECIPE_KEYS
    if unknown:
        raise SpecError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_RECIPE_KEYS)}")
    for k in ("name", "suspect", "variants", "signals"):
        if k not in data:
            raise SpecError(f"{where}: missing {k!r}")
    variants = data["variants"]
    if not isinstance(variants, list) or len(variants) < 2:
        raise SpecError(f"{where}: needs at least two variants to compare")
    for v in variants:
        if not isinstance(v, dict) or "name" not in v:
            raise SpecError(f"{where}: every variant needs a name")
        for t in v.get("transforms", []) or []:
            if not isinstance(t, dict) or t.get("op") not in TRANSFORMS:
                raise SpecError(f"{where}: variant {v['name']!r} has transform {t!r}; ops: {sorted(TRANSFORMS)}")
    signals = data["signals"]
    if not isinstance(signals, list) or not signals:
        raise SpecError(f"{where}: signals must be a non-empty list")
    for sig in signals:
        if not isinstance(sig, dict) or not {"key", "y", "kind"} <= set(sig) or set(sig) - _SIGNAL_KEYS:
            raise SpecError(f"{where}: signal {sig!r} needs key, y, kind (allowed keys: {sorted(_SIGNAL_KEYS)})")
        if sig["kind"] not in SIGNAL_KINDS:
            raise SpecError(f"{where}: signal {sig['key']!r} kind {sig['kind']!r} is not one of {SIGNAL_KINDS}")
        for sup in sig.get("supports", []) or []:
            if sup.get("bottleneck") not in BOTTLENECKS or "low" not in sup or "high" not in sup:
                raise SpecError(f"{where}: supports entry {sup!r} needs bottleneck (one of {sorted(BOTTLENECKS)}), "
                                "low, high")
    return ProbeRecipe(
        name=str(data["name"]), suspect=str(data["suspect"]), description=str(data.get("description", "")),
        variants=variants, load=dict(data.get("load") or {}), signals=signals,
        quick=bool(data.get("quick", False)), path=str(path))


def load_recipes(extra_dirs: list[str | Path] | None = None) -> list[ProbeRecipe]:
    """Recipes from the package folder, then user folders (a later recipe with the same name replaces an earlier one)."""
    dirs: list[Path] = [PACKAGE_DIR]
    env = os.environ.get("AUTORESEARCH_PROBES_DIR")
    if env:
        dirs += [Path(p) for p in env.split(os.pathsep) if p]
    dirs += [Path(p) for p in extra_dirs or []]
    out: dict[str, ProbeRecipe] = {}
    for d in dirs:
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.y*ml")):
            try:
                data = yaml.safe_load(p.read_text())
            except yaml.YAMLError as e:
                raise SpecError(f"probe recipe {p} is not valid YAML: {e}") from None
            r = _check_recipe(data, p)
            out[r.name] = r
    return list(out.values())


# ---------------------------------------------------------------- transforms


def _median(reqs: list[Any], attr: str) -> float:
    return float(np.median([getattr(r, attr) for r in reqs])) if reqs else 0.0


def _tokens(params: dict, origin: list[Any], attr: str) -> int:
    """A length from the recipe: fixed ``tokens``, ``factor_of_median`` or a ``quantile`` of the original pool."""
    if "tokens" in params:
        return int(params["tokens"])
    if "factor_of_median" in params:
        return max(1, int(round(float(params["factor_of_median"]) * _median(origin, attr))))
    if "quantile" in params:
        vals = [getattr(r, attr) for r in origin]
        return max(1, int(round(float(np.quantile(vals, float(params["quantile"]))))))
    raise SpecError(f"transform {params.get('op')!r} needs 'tokens', 'factor_of_median' or 'quantile'")


def _rehash(r: Any, messages: list[dict] | None, prompt: str | None, tools: list[dict] | None) -> Any:
    rendered = render_prompt(messages, tools, prompt)
    return replace(r, messages=messages, prompt=prompt, tools=tools, prompt_tokens=count_tokens(rendered),
                   block_hashes=block_hashes(rendered, r.block_tokens), synth_tail_tokens=None, synth_seed=None)


def _with_text(r: Any, text: str, *, keep_tools: bool = True) -> Any:
    """The request with its whole prompt replaced by ``text`` (one user message for chat)."""
    if r.api == "chat":
        return _rehash(r, [{"role": "user", "content": text}], None, r.tools if keep_tools else None)
    return _rehash(r, None, text, r.tools if keep_tools else None)


def _appended(r: Any, text: str) -> Any:
    """The request with ``text`` appended to its last message (or prompt): its prefix stays as it was."""
    if r.api == "chat" and r.messages:
        last = dict(r.messages[-1])
        content = last.get("content")
        last["content"] = (content if isinstance(content, str) else render_prompt([last])) + text
        return _rehash(r, [*r.messages[:-1], last], None, r.tools)
    return _rehash(r, None, (r.prompt or "") + text, r.tools)


def _overhead(r: Any) -> int:
    """Tokens the chat rendering adds around a single user message (0 for completions)."""
    return count_tokens(render_prompt([{"role": "user", "content": ""}])) if r.api == "chat" else 0


def _seed(r: Any, salt: str) -> int:
    return random.Random(f"{salt}:{r.id}").getrandbits(48)


def _set_prompt(reqs: list[Any], p: dict, origin: list[Any]) -> list[Any]:
    n = _tokens(p, origin, "prompt_tokens")
    return [_with_text(r, synth_text(max(1, n - _overhead(r)), _seed(r, "set_prompt")), keep_tools=False) for r in reqs]


def _append_prompt(reqs: list[Any], p: dict, origin: list[Any]) -> list[Any]:
    f = float(p.get("factor", 2.0))
    out = []
    for r in reqs:
        extra = max(0, int(round(r.prompt_tokens * (f - 1.0))))
        out.append(_appended(r, synth_text(extra, _seed(r, "append"))) if extra else r)
    return out


def _set_output(reqs: list[Any], p: dict, origin: list[Any]) -> list[Any]:
    n = _tokens(p, origin, "output_tokens")
    return [replace(r, output_tokens=n) for r in reqs]


def _scale_output(reqs: list[Any], p: dict, origin: list[Any]) -> list[Any]:
    f = float(p.get("factor", 2.0))
    return [replace(r, output_tokens=max(1, int(round(r.output_tokens * f)))) for r in reqs]


def _unique_prefix(reqs: list[Any], p: dict, origin: list[Any]) -> list[Any]:
    return [_with_text(r, synth_text(max(1, r.prompt_tokens - _overhead(r)), _seed(r, "unique")), keep_tools=False)
            for r in reqs]


def _shared_prefix(reqs: list[Any], p: dict, origin: list[Any]) -> list[Any]:
    if "tokens" in p:
        n = int(p["tokens"])
    else:
        n = int(round(float(p.get("fraction", 0.5)) * _median(origin, "prompt_tokens")))
    common = synth_text(n, int(p.get("seed", 7)))
    return [_with_text(r, common + synth_text(max(16, r.prompt_tokens - n - _overhead(r)), _seed(r, "tail")),
                       keep_tools=False) for r in reqs]


def _inject_long(reqs: list[Any], p: dict, origin: list[Any]) -> list[Any]:
    every = int(p.get("every", 8))
    n = _tokens(p, origin, "prompt_tokens")
    out_tokens = int(p.get("output", 16))
    return [replace(_with_text(r, synth_text(max(1, n - _overhead(r)), _seed(r, "long")), keep_tools=False),
                    output_tokens=out_tokens)
            if i % every == every - 1 else r for i, r in enumerate(reqs)]


TRANSFORMS: dict[str, Callable[[list[Any], dict, list[Any]], list[Any]]] = {
    "set_prompt": _set_prompt, "append_prompt": _append_prompt, "set_output": _set_output,
    "scale_output": _scale_output, "unique_prefix": _unique_prefix, "shared_prefix": _shared_prefix,
    "inject_long": _inject_long,
}


def transform(reqs: list[Any], transforms: list[dict], origin: list[Any] | None = None) -> list[Any]:
    """Apply a variant's transforms in order (PoolRequests are copied, never edited). Lengths given relative
    to the pool (``factor_of_median``, ``quantile``) are taken from ``origin`` (default: ``reqs``)."""
    origin = list(reqs) if origin is None else origin
    for t in transforms or []:
        reqs = TRANSFORMS[t["op"]](reqs, t, origin)
    return reqs


# ---------------------------------------------------------------- running


@dataclass
class ProbeVariant:
    name: str
    measured: dict[str, dict[str, float | None]]  # signal key -> {"x", "y"}
    rate_rps: float
    n_requests: int
    step: dict[str, Any]
    engine: dict[str, Any]


@dataclass
class ProbeResult:
    name: str
    suspect: str
    values: dict[str, float | None]  # signal key -> value
    variants: list[ProbeVariant]
    interpretation: str
    supports_fired: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _lookup(d: dict, path: str) -> float | None:
    cur: Any = d
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return float(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) and math.isfinite(cur) else None


def reduce_signal(kind: str, xs: list[float | None], ys: list[float | None]) -> float | None:
    """One number from the variants: log-log slope of y on x, y_last/y_first, y_last − y_first, or y_last."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if kind == "last":
        return pts[-1][1] if pts else None
    if len(pts) < 2:
        return None
    if kind == "ratio":
        return pts[-1][1] / pts[0][1] if pts[0][1] > 0 else None
    if kind == "diff":
        return pts[-1][1] - pts[0][1]
    pts = [(x, y) for x, y in pts if x is not None and x > 0 and y > 0]
    if len(pts) < 2 or len({x for x, _ in pts}) < 2:
        return None
    lx, ly = np.log([x for x, _ in pts]), np.log([y for _, y in pts])
    return float(np.polyfit(lx, ly, 1)[0])


def _itl_max_pcts(records: list[Any]) -> dict[str, float]:
    """Percentiles over requests of each request's longest inter-token gap (a stall hits few tokens but many requests)."""
    worst = [max(r.itl_s) * 1e3 for r in records if r.status == "ok" and r.itl_s]
    if not worst:
        return {}
    return {f"p{q}": float(np.percentile(worst, q)) for q in (50, 90, 99)}


def run_probe(recipe: ProbeRecipe, pool: Any, deployment: Any, *, sla: SLA, model: str,
              capacity_rps: float | None, work_dir: Path, request_timeout_s: float, seed: int = 0,
              resolved_config: dict | None = None, max_requests: int | None = None) -> ProbeResult:
    """Run every variant of a recipe through the runner (``poisson_step``, the profile's request timeout)
    and reduce it to the recipe's signal."""
    from autoresearch_dagster.measure.step import poisson_step
    from autoresearch_dagster.pool.schema import read_pool, write_pool

    base = list(pool.iter_requests("serving"))
    if not base:
        raise SpecError(f"probe {recipe.name}: the pool has no serving requests")
    variants: list[ProbeVariant] = []
    for i, v in enumerate(recipe.variants):
        load = {**recipe.load, **(v.get("load") or {})}
        n_req = int(load.get("requests", 60))
        if max_requests:
            n_req = min(n_req, max_requests)
        reqs = transform(base[: max(n_req, 1)], v.get("transforms") or [], origin=base)
        vdir = work_dir / recipe.name / v["name"]
        pool_path = write_pool(reqs, vdir, {"block_tokens": reqs[0].block_tokens, "source_format": "probe",
                                            "probe": recipe.name, "variant": v["name"]})
        vpool = read_pool(pool_path)
        if capacity_rps and "rate_fraction" in load:
            rate = float(load["rate_fraction"]) * capacity_rps
        else:
            rate = float(load.get("rate_rps", 1.0))
        deployment.flush_cache()
        before = deployment.metrics_text()
        run = poisson_step(deployment, vpool, sla, rate_rps=rate, duration_s=n_req / rate, model=model, seed=seed + i,
                           step_id=f"probe-{recipe.name}-{v['name']}", request_timeout_s=request_timeout_s,
                           burstiness=float(load.get("burstiness", 1.0)))
        outcome, schedule, step = run.outcome, run.schedule, run.step.to_dict()
        series = list(outcome.engine_timeseries or [])
        if before:  # anchor the counters at the step start (in-run samples begin one interval late)
            series.insert(0, {"t": 0.0, **{k: v for k, v in snapshot(before).items() if k.endswith("_total")}})
        if len(series) < 2:
            series.append({"t": outcome.duration_s, **snapshot(deployment.metrics_text())})
        engine = analyze_timeseries(series, resolved_config).to_dict()
        ctx = {**step, "engine": engine, "itl_max_ms": _itl_max_pcts(outcome.records),
               "prompt_tokens_mean": float(np.mean([s.prompt_tokens for s in schedule])),
               "output_tokens_mean": float(np.mean([s.output_tokens for s in schedule])),
               "rate_rps": rate, "x": v.get("x")}
        measured = {sig["key"]: {"x": v.get("x") if sig.get("x", "x") == "x" else _lookup(ctx, sig["x"]),
                                 "y": _lookup(ctx, sig["y"])} for sig in recipe.signals}
        variants.append(ProbeVariant(name=v["name"], measured=measured, rate_rps=rate, n_requests=len(schedule),
                                     step=step, engine=engine))
    values: dict[str, float | None] = {}
    fired: list[str] = []
    parts: list[str] = []
    for sig in recipe.signals:
        key = sig["key"]
        value = reduce_signal(sig["kind"], [v.measured[key]["x"] for v in variants],
                              [v.measured[key]["y"] for v in variants])
        values[key] = value
        ys = ", ".join(f"{v.name}={v.measured[key]['y']:.4g}" if v.measured[key]["y"] is not None else f"{v.name}=n/a"
                       for v in variants)
        label = sig.get("label", key)
        parts.append(f"{label} = {value:.3g} ({sig['y']}: {ys})" if value is not None
                     else f"{label}: not measurable ({sig['y']}: {ys})")
        for sup in sig.get("supports") or []:
            lo, hi = float(sup["low"]), float(sup["high"])
            if value is not None and (value >= lo if hi >= lo else value <= lo) and sup["bottleneck"] not in fired:
                fired.append(sup["bottleneck"])
    interp = f"{recipe.suspect}: " + "; ".join(parts) + (f"; supports {', '.join(fired)}" if fired else "")
    return ProbeResult(name=recipe.name, suspect=recipe.suspect, values=values, variants=variants,
                       interpretation=interp, supports_fired=fired)


# ---------------------------------------------------------------- memory


def endpoint_traits(endpoint: Any, workload: Any) -> dict[str, Any]:
    """Coarse traits that decide which probes are worth running on a similar endpoint."""
    return {
        "model": endpoint.model, "gpu": endpoint.hardware.gpu, "gpus": endpoint.hardware.count,
        "long_prompts": workload.share_long_prompts >= 0.1,
        "prefix_heavy": workload.prefix_hit_rate >= 0.3,
        "bursty": (workload.interarrival_cv or 0.0) >= 1.5,
        "short_outputs": workload.share_short_outputs >= 0.5,
    }


def record_probe_use(memory_path: Path, endpoint: str, traits: dict[str, Any], results: list[ProbeResult],
                     top_bottlenecks: list[str], engine_version: str | None = None) -> None:
    """Append one line per probe: its value and whether it supported a top-ranked hypothesis (atomic rewrite)."""
    memory_path = Path(memory_path)
    memory_path.parent.mkdir(parents=True, exist_ok=True)
    old = memory_path.read_text() if memory_path.exists() else ""
    lines = [json.dumps({"version": 1, "endpoint": endpoint, "traits": traits, "probe": r.name, "values": r.values,
                         "supports_fired": r.supports_fired,
                         "useful_for": [b for b in r.supports_fired if b in top_bottlenecks],
                         "engine_version": engine_version}, sort_keys=True) for r in results]
    atomic_write_text(memory_path, old + "".join(line + "\n" for line in lines))


def useful_probes(memory_path: Path | None, traits: dict[str, Any]) -> list[str]:
    """Probes that were useful before on endpoints sharing at least the workload traits (most useful first)."""
    if not memory_path or not Path(memory_path).exists():
        return []
    keys = ("long_prompts", "prefix_heavy", "bursty", "short_outputs")
    counts: dict[str, int] = {}
    for line in Path(memory_path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        t = row.get("traits") or {}
        if row.get("useful_for") and all(t.get(k) == traits.get(k) for k in keys):
            counts[row["probe"]] = counts.get(row["probe"], 0) + 1
    return [p for p, _ in sorted(counts.items(), key=lambda kv: -kv[1])]
