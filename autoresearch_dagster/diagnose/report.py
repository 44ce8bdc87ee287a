"""Owns the diagnostic report: gathering the evidence (workload, curve, metrics, profile, probes), findings,
ranked hypotheses, and the JSON / markdown renderings.

``diagnose`` is the one entry point (the CLI and the Dagster asset both call it). Every measurement
goes through the runner: ``find_capacity`` for the load curve, then one diagnostic step at the rate
where the SLA broke (``measure.step.poisson_step``, the search's own step and timeout), profiled,
whose engine time series feeds the metrics analysis; probes run the same way.
"""
from __future__ import annotations

import base64
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from autoresearch_dagster.diagnose import plots
from autoresearch_dagster.diagnose.curve import CurveAnalysis, analyze_curve
from autoresearch_dagster.diagnose.hypotheses import Hypothesis, probe_signals, score
from autoresearch_dagster.diagnose.metrics import EngineStats, analyze_timeseries
from autoresearch_dagster.diagnose.probes import (ProbeResult, endpoint_traits, load_recipes, record_probe_use,
                                                  run_probe, useful_probes)
from autoresearch_dagster.diagnose.profile import ProfileError, ProfileSummary, parse_profile
from autoresearch_dagster.loadgen.prometheus import snapshot
from autoresearch_dagster.measure.profiles import MeasurementProfile, measurement_profile
from autoresearch_dagster.pool.workload import WorkloadStats, prefix_reuse, workload_stats
from autoresearch_dagster.outputs.files import atomic_write_text, write_json
from autoresearch_dagster.outputs.plots import plot_load_curve
from autoresearch_dagster.spec import KNOBS, EndpointSpec, config_hash


@dataclass
class Finding:
    id: str
    source: str  # workload | curve | metrics | profile | probe:<name>
    title: str
    evidence: dict[str, Any]  # the numbers
    where: str  # where the numbers came from

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DiagnosticReport:
    endpoint: str
    config: dict[str, Any]
    hypotheses: list[Hypothesis]
    findings: list[Finding]
    features: dict[str, float | None]
    plots: dict[str, str] = field(default_factory=dict)  # name -> PNG path
    details: dict[str, Any] = field(default_factory=dict)  # workload, curve, engine, profile, probes
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "config": self.config, "config_hash": config_hash(self.config),
                "hypotheses": [h.to_dict() for h in self.hypotheses],
                "findings": [f.to_dict() for f in self.findings],
                "features": self.features, "plots": self.plots, "details": self.details, "meta": self.meta}

    def to_markdown(self, *, inline_images: bool = False, top: int = 8) -> str:
        """Markdown with the plots referenced by file name (next to report.md) or inlined as data URIs."""
        def img(name: str, alt: str) -> str:
            path = self.plots.get(name)
            if not path:
                return ""
            if inline_images:
                data = base64.b64encode(Path(path).read_bytes()).decode()
                return f"![{alt}](data:image/png;base64,{data})\n"
            return f"![{alt}]({Path(path).name})\n"

        lines = [f"# Diagnosis: {self.endpoint}", ""]
        m = self.meta
        lines.append(f"Config `{config_hash(self.config)}` ({_cfg_text(self.config)}); engine {m.get('engine', '?')} "
                     f"{m.get('engine_version', '')}; {m.get('n_requests', '?')} pool requests; "
                     f"measurement profile {m.get('measurement', '?')} ({'quick' if m.get('quick') else 'full'} "
                     f"diagnosis), {m.get('wall_s', 0):.1f} s.")
        lines += ["", "## Ranked bottleneck hypotheses", "",
                  "| # | bottleneck | direction | score | knobs to try |", "|---|---|---|---|---|"]
        for i, h in enumerate(self.hypotheses[:top], 1):
            lines.append(f"| {i} | {h.bottleneck} | {h.direction} | {h.score:.2f} | {', '.join(h.knobs)} |")
        lines.append("")
        for i, h in enumerate(self.hypotheses[:3], 1):
            lines.append(f"**{i}. {h.bottleneck}** ({h.direction}, score {h.score:.2f}, evidence coverage "
                         f"{h.coverage:.0%}): {h.summary}.")
            for e in h.evidence or ["no supporting evidence measured"]:
                lines.append(f"- {e}")
            lines.append("")
        lines.append(img("hypotheses", "hypothesis scores"))
        lines += ["## Findings", ""]
        for f in self.findings:
            nums = ", ".join(f"{k}={_num(v)}" for k, v in f.evidence.items())
            lines.append(f"- **{f.title}** — {nums} _(from {f.where})_")
        lines += ["", "## Plots", ""]
        for name, alt in (("curve", "load curve"), ("engine", "engine metrics at the diagnostic step"),
                          ("profile", "profile breakdown and kernel gaps"), ("workload", "prompt and output lengths")):
            lines.append(img(name, alt))
        return "\n".join(lines).rstrip() + "\n"

    def write(self, out_dir: Path) -> tuple[Path, Path]:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        md = atomic_write_text(out_dir / "report.md", self.to_markdown())
        js = write_json(out_dir / "report.json", self.to_json())
        return md, js


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _cfg_text(cfg: dict[str, Any]) -> str:
    set_ = {k: v for k, v in cfg.items() if v is not None}
    return ", ".join(f"{k}={v}" for k, v in sorted(set_.items())) or "engine defaults"


# ---------------------------------------------------------------- evidence → features and findings


def resolved_knobs(server_info: dict[str, Any] | None, config: dict[str, Any]) -> dict[str, Any]:
    """Knob values as the server resolved them (``/server_info``), falling back to the requested config."""
    info = server_info or {}
    out = {k: info[k] for k in KNOBS if k in info}
    if info.get("engine") == "vllm":  # vLLM's resolved knobs, and its sequence cap as the running-batch cap
        out = dict(info.get("server_args") or {})
        if out.get("max_num_seqs"):
            out["max_running_requests"] = out["max_num_seqs"]
    states = info.get("internal_states") or []
    if out.get("max_running_requests") is None and states and isinstance(states[0], dict):
        # SGLang leaves the field unset and reports the cap it computed per DP worker here
        eff = states[0].get("effective_max_running_requests_per_dp")
        if eff:
            out["max_running_requests"] = int(eff) * max(1, len(states))
    for k, v in config.items():
        if out.get(k) is None:
            out[k] = v
    return out


def collect_features(w: WorkloadStats, c: CurveAnalysis | None, m: EngineStats | None, p: ProfileSummary | None,
                     resolved: dict[str, Any], probe_feats: dict[str, float | None], *,
                     step_potential_hit: float | None = None) -> tuple[dict[str, float | None], dict[str, str]]:
    """Flat numeric features for scoring, and where each came from.

    ``step_potential_hit``: the infinite-cache hit rate of the requests the diagnostic step sent (a cold
    cache after the flush), the fair yardstick for the hit rate the engine reported over that step."""
    f: dict[str, float | None] = {}
    src: dict[str, str] = {}

    def put(key: str, value: Any, where: str) -> None:
        f[key] = None if value is None else float(value)
        src[key] = where

    put("w.share_long_prompts", w.share_long_prompts, "workload")
    put("w.prefix_hit_rate", w.prefix_hit_rate, "workload")
    put("w.interarrival_cv", w.interarrival_cv, "workload")
    put("w.dispersion_index", w.dispersion_index, "workload")
    put("w.prompt_output_ratio", w.prompt_output_ratio if np.isfinite(w.prompt_output_ratio) else None, "workload")
    if c is not None and c.n_steps:
        broke = c.break_rps is not None
        put("c.breaks_tpot_itl", (1.0 if any(t in ("tpot", "itl") for t in c.first_broken) else 0.0) if broke else None,
            f"curve break at {c.break_rps} rps")
        put("c.breaks_ttft", (1.0 if "ttft" in c.first_broken else 0.0) if broke else None,
            f"curve break at {c.break_rps} rps")
        put("c.itl_tail_ratio", c.itl_tail_ratio, "curve break step")
        put("c.per_token_regime", 1.0 if c.regime == "per_token" else 0.0, "curve growth")
        tp = max([v for k, v in c.headroom_low.items() if k in ("tpot", "itl")], default=None)
        put("c.tpot_headroom_low", tp, f"curve step at {c.low_rps} rps")
        put("c.ttft_headroom_low", c.headroom_low.get("ttft"), f"curve step at {c.low_rps} rps")
    if m is not None and m.n_samples:
        where = "engine metrics, diagnostic step"
        put("m.token_usage_max", m.token_usage_max, where)
        put("m.retractions", m.retractions, where)
        put("m.queue_nonempty", m.share_queue_nonempty, where)
        put("m.share_at_running_cap", m.share_at_running_cap, where)
        put("m.at_cap_when_queued", m.at_cap_when_queued, where)
        put("m.usage_when_queued", m.usage_when_queued, where)
        put("m.share_above_graph_bs", m.share_above_graph_bs, where)
        put("m.cache_hit_rate", m.cache_hit_rate, where)
        put("m.spec_accept_length", m.spec_accept_length, where)
        put("m.running_mean", m.running_mean, where)
        put("m.potential_hit_rate", step_potential_hit, "block hashes of the diagnostic step's requests")
    if p is not None and p.has_gpu:
        kernel_total = sum(v for k, v in p.breakdown_us.items() if k != "cpu_scheduling")
        where = f"profile ({len(p.files)} trace file(s))"
        put("p.gemm_share", p.breakdown_us["gemm_moe"] / kernel_total if kernel_total else None, where)
        put("p.prefill_time_share", p.prefill_time_share, where)
        put("p.decode_stall_ratio", p.decode_stall_ratio if p.prefill_interrupts_decode else 0.0, where)
        put("p.launch_gap_share", p.launch_gap_share, where)
    put("cfg.speculative", 1.0 if resolved.get("speculative_algorithm") else 0.0, "resolved server config")
    put("cfg.fp8", 1.0 if KNOBS["quantization"].meaning(resolved.get("quantization")).fp8 else 0.0,
        "resolved server config")
    for k, v in probe_feats.items():
        put(k, v, "probe " + k.split(".")[1])
    # where the derived features (hypotheses.derive_features) come from
    src.update({"x.cache_gap": "step's block hashes vs engine cache-hit counters",
                "m.kv_headroom": src.get("m.token_usage_max", "engine metrics"),
                "m.running_small": src.get("m.running_mean", "engine metrics"),
                "x.no_speculation": "resolved server config, engine metrics", "x.no_fp8": "resolved server config",
                "p.prefill_gemm_share": src.get("p.gemm_share", "profile")})
    return f, src


def build_findings(w: WorkloadStats, c: CurveAnalysis | None, m: EngineStats | None, p: ProfileSummary | None,
                   probes: list[ProbeResult], pool_where: str, step_where: str) -> list[Finding]:
    out = [
        Finding("workload.lengths", "workload", "Prompt and output lengths",
                {"prompt_p50": w.prompt_tokens["p50"], "prompt_p99": w.prompt_tokens["p99"],
                 "output_p50": w.output_tokens["p50"], "output_p99": w.output_tokens["p99"],
                 "share_long_prompts": w.share_long_prompts, "share_short_outputs": w.share_short_outputs,
                 "prompt_per_output_token": w.prompt_output_ratio}, pool_where),
        Finding("workload.prefix_reuse", "workload", "Prefix reuse (infinite cache over block hashes)",
                {"hit_rate": w.prefix_hit_rate,
                 **{f"prefix{i + 1}": f"{sp.prefix_tokens} tok × {sp.requests} req = {sp.tokens_saved} saved"
                    for i, sp in enumerate(w.top_prefixes[:3])}}, pool_where),
        Finding("workload.arrivals", "workload", "Arrival burstiness",
                {"mean_rate_rps": w.mean_rate_rps, "interarrival_cv": w.interarrival_cv,
                 "dispersion_index": w.dispersion_index, "window_s": w.dispersion_window_s}, pool_where),
        Finding("workload.structure", "workload", "Tools, structured output, multi-turn",
                {"share_tools": w.share_tools, "share_structured": w.share_structured,
                 "conversations": w.conversations, "turns_mean": w.turns_mean, "turns_max": w.turns_max}, pool_where),
    ]
    if c is not None and c.n_steps:
        out.append(Finding("curve.knee", "curve", "Load curve knee and the SLA term that breaks first",
                           {"capacity_rps": c.capacity_rps, "knee_rps": c.knee_rps, "break_rps": c.break_rps,
                            "first_broken": "+".join(c.first_broken) or "none", "regime": c.regime},
                           f"capacity search, {c.n_steps} steps"))
        out.append(Finding("curve.growth", "curve", "What grows from light load to the break",
                           {"ttft_p50_growth": c.ttft_growth, "tpot_p50_growth": c.tpot_growth,
                            "itl_p99_over_p50": c.itl_tail_ratio, "queue_growth": c.queue_growth,
                            **{f"{k}_of_limit_at_{c.low_rps:g}rps": v for k, v in c.headroom_low.items()}},
                           "capacity search steps"))
    if m is not None and m.n_samples:
        out.append(Finding("metrics.queue", "metrics", "Queue and running batch at the diagnostic step",
                           {"queue_mean": m.queue_mean, "queue_p95": m.queue_p95, "queue_slope_per_s": m.queue_slope_per_s,
                            "running_mean": m.running_mean, "running_max": m.running_max,
                            "max_running_requests": m.max_running_requests,
                            "share_at_running_cap": m.share_at_running_cap,
                            "at_cap_when_queued": m.at_cap_when_queued}, step_where))
        out.append(Finding("metrics.memory", "metrics", "KV cache pressure and prefix-cache hits",
                           {"token_usage_max": m.token_usage_max, "token_usage_mean": m.token_usage_mean,
                            "usage_when_queued": m.usage_when_queued,
                            "retractions": m.retractions, "cache_hit_rate": m.cache_hit_rate}, step_where))
        out.append(Finding("metrics.decode", "metrics", "Decode batch vs CUDA graphs, speculation",
                           {"cuda_graph_max_bs": m.cuda_graph_max_bs, "share_above_graph_bs": m.share_above_graph_bs,
                            "spec_accept_length": m.spec_accept_length}, step_where))
    if p is not None:
        top = ", ".join(f"{n[:40]} ({cat})" for n, cat, _ in p.top_kernels[:3])
        out.append(Finding("profile.breakdown", "profile", "Where the profiled time goes",
                           {**{k: v for k, v in p.breakdown_share.items() if v > 0}, "top": top},
                           f"{len(p.files)} trace file(s)"))
        if p.has_gpu:
            out.append(Finding("profile.timeline", "profile", "Timeline: idle GPU, launch gaps, prefill interrupting decode",
                               {"gpu_idle_fraction": p.gpu_idle_fraction, "launch_gap_share": p.launch_gap_share,
                                "cpu_gpu_overlap": p.cpu_gpu_overlap, "prefill_interruptions": p.prefill_interruptions,
                                "decode_stall_ratio": p.decode_stall_ratio, "prefill_time_share": p.prefill_time_share},
                               f"{len(p.files)} trace file(s)"))
    for r in probes:
        out.append(Finding(f"probe.{r.name}", f"probe:{r.name}", r.interpretation,
                           {k: v for k, v in r.values.items()}, f"probe {r.name}: {len(r.variants)} runner steps"))
    return out


# ---------------------------------------------------------------- the run


def _pool_burstiness(workload: WorkloadStats) -> float:
    """The pool's own burstiness as a gamma shape (1/CV²; 1 = Poisson): bursts move the knee."""
    cv = workload.interarrival_cv or 1.0
    return float(min(1.0, max(0.05, 1.0 / cv ** 2))) if cv > 1.2 else 1.0


def _run_at(dep: Any, pool: Any, endpoint: EndpointSpec, rate: float, n_requests: int, *, settings: Any,
            seed: int, step_id: str, start_index: int = 0) -> Any:
    """``n_requests`` (on average) at ``rate`` with the profile's burstiness and request timeout, cache flushed."""
    from autoresearch_dagster.measure.step import poisson_step

    return poisson_step(dep, pool, endpoint.sla, rate_rps=rate, duration_s=max(n_requests / rate, 1.0),
                        model=endpoint.model, seed=seed, step_id=step_id, request_timeout_s=settings.request_timeout_s,
                        burstiness=settings.burstiness, start_index=start_index, flush_cache=True)


def _diagnostic_step(dep: Any, pool: Any, endpoint: EndpointSpec, rate: float, n_requests: int, *, settings: Any,
                     seed: int) -> tuple[Any, list[Any], list[dict]]:
    """One load step at the rate where the SLA broke; its engine time series (or bracketing scrapes)."""
    before = dep.metrics_text()
    run = _run_at(dep, pool, endpoint, rate, n_requests, settings=settings, seed=seed + 7919,
                  step_id=f"diagnose-{rate:.4g}rps")
    after = dep.metrics_text()
    outcome, sched, step = run.outcome, run.schedule, run.step
    # The scrape before the step anchors the counters (in-run samples start a sampling interval late);
    # engines without in-run samples get the two bracketing scrapes.
    series = list(outcome.engine_timeseries or [])
    if before:
        series.insert(0, {"t": 0.0, **_counters(snapshot(before))})
    if len(series) < 2 and after:
        series.append({"t": outcome.duration_s, **snapshot(after)})
    return step, sched, series


def _counters(snap: dict[str, float]) -> dict[str, float]:
    """Only the cumulative counters of a scrape (gauges before the step describe the previous step)."""
    return {k: v for k, v in snap.items() if k.endswith("_total")}


def _profiled_step(dep: Any, pool: Any, endpoint: EndpointSpec, rate: float, n_requests: int, *, settings: Any,
                   seed: int, profile_dir: Path) -> list[str]:
    """A short step under the profiler (profiles grow with every kernel launched, so keep it small)."""
    profile_dir.mkdir(parents=True, exist_ok=True)
    dep.start_profile(str(profile_dir))
    try:
        _run_at(dep, pool, endpoint, rate, n_requests, settings=settings, seed=seed + 104729,
                step_id=f"profile-{rate:.4g}rps", start_index=n_requests)
    finally:
        files = list(dep.stop_profile() or [])
    return files


def _profile(dep: Any, pool: Any, endpoint: EndpointSpec, rate: float, n_requests: int, *, settings: Any,
             seed: int, profile_dir: Path, say: Callable[[str], None]) -> tuple[ProfileSummary | None, str | None]:
    """(summary, None), or (None, why not): an endpoint without a profiler still gets the other evidence."""
    try:
        files = _profiled_step(dep, pool, endpoint, rate, n_requests, settings=settings, seed=seed,
                               profile_dir=profile_dir)
    except RuntimeError as e:  # EngineError, or the HTTP runner refusing /start_profile
        say(f"profile unavailable: {e}")
        return None, f"profiler failed: {e}"
    if not files:
        return None, "the deployment wrote no trace files (no profiler, or traces on another machine)"
    try:
        return parse_profile(Path(files[0]).parent if len(files) > 1 else Path(files[0])), None
    except ProfileError as e:
        say(f"profile unreadable: {e}")
        return None, str(e)


def diagnose(endpoint: EndpointSpec, pool: Any, *, engine: Any, config: dict[str, Any], out_dir: Path,
             capacity: Any = None, probes: bool = True, profile: bool = True,
             measurement: str | MeasurementProfile = "standard", probe_dirs: list[Path] | None = None,
             memory_path: Path | None = None, seed: int = 0,
             progress: Callable[[str], None] | None = None) -> DiagnosticReport:
    """Measure the endpoint under its pool and explain where and why it breaks.

    ``capacity``: an existing ``CapacityResult`` (or its dict) to reuse instead of searching again.
    ``measurement``: the measurement profile (or its name): its load steps, request timeout and
    diagnosis depth; the steps replay the pool's own burstiness.
    ``memory_path``: a JSONL file where probe usefulness is appended (and read to pick quick probes).
    """
    from autoresearch_dagster.measure.capacity import find_capacity

    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reqs = list(pool.iter_requests("serving"))
    w = workload_stats(reqs)
    pool_where = f"replay pool {getattr(pool, 'path', '<memory>')} ({len(reqs)} serving requests)"
    say(f"workload: {len(reqs)} requests, prefix hit rate {w.prefix_hit_rate:.2f}, CV {w.interarrival_cv}")
    plan = measurement_profile(measurement) if isinstance(measurement, str) else measurement
    quick = plan.quick_diagnosis
    settings = replace(plan.capacity, burstiness=_pool_burstiness(w))
    dep = engine.deploy(config, seed=seed)
    probe_results: list[ProbeResult] = []
    prof: ProfileSummary | None = None
    try:
        resolved = resolved_knobs(dep.server_info(), config)
        if capacity is None:
            say("capacity search")
            capacity = find_capacity(dep, pool, endpoint.sla, gpus=endpoint.gpus, model=endpoint.model,
                                     settings=settings, seed=seed)
        curve = analyze_curve(capacity, endpoint.sla)
        cap = curve.capacity_rps or 0.0
        rate = curve.break_rps or (cap * 1.5 if cap > 0 else 1.0)
        say(f"capacity {cap:.3g} rps; diagnostic step at {rate:.3g} rps")
        n_diag = int(max(60, rate * 10)) if quick else int(max(150, rate * 30))
        step, sched, series = _diagnostic_step(dep, pool, endpoint, rate, min(n_diag, 3000), settings=settings,
                                               seed=seed)
        engine_stats = analyze_timeseries(series, resolved)
        step_potential_hit = prefix_reuse(sched)[0]
        profile_note = "not requested"
        if profile:
            prof, profile_note = _profile(dep, pool, endpoint, rate, 8 if quick else 16, settings=settings, seed=seed,
                                          profile_dir=out_dir / "profile", say=say)
        if probes:
            recipes = load_recipes(probe_dirs)
            traits = endpoint_traits(endpoint, w)
            if quick:
                liked = set(useful_probes(memory_path, traits)[:2])
                recipes = [r for r in recipes if r.quick or r.name in liked]
            for r in recipes:
                say(f"probe {r.name}")
                probe_results.append(run_probe(r, pool, dep, sla=endpoint.sla, model=endpoint.model,
                                               capacity_rps=cap or None, work_dir=out_dir / "probes", seed=seed,
                                               resolved_config=resolved, max_requests=40 if quick else None,
                                               request_timeout_s=settings.request_timeout_s))
        version = engine.version() if hasattr(engine, "version") else ""
    finally:
        dep.close()
    extra, probe_feats = probe_signals(load_recipes(probe_dirs) if probe_results else [],
                                       {r.name: r.values for r in probe_results})
    features, sources = collect_features(w, curve, engine_stats, prof, resolved, probe_feats,
                                         step_potential_hit=step_potential_hit)
    hyps = score(features, extra, sources)
    step_where = f"diagnostic step {step.step_id} ({step.n_sent} requests at {rate:.3g} rps)"
    findings = build_findings(w, curve, engine_stats, prof, probe_results, pool_where, step_where)
    if probe_results and memory_path:
        record_probe_use(memory_path, endpoint.name, endpoint_traits(endpoint, w), probe_results,
                         [h.bottleneck for h in hyps[:2]], version)
    plot_paths: dict[str, str] = {}
    steps = list(getattr(capacity, "steps", None) or (capacity.get("steps", []) if isinstance(capacity, dict) else []))
    for name, fn in (("curve", lambda p: plot_load_curve([(steps, curve.capacity_rps)], p, sla=endpoint.sla,
                                                         title="Load curve") if steps else None),
                     ("engine", lambda p: plots.engine_timeseries(series, p)),
                     ("profile", lambda p: plots.profile_breakdown(prof, p) if prof is not None else None),
                     ("hypotheses", lambda p: plots.hypotheses(hyps, p)),
                     ("workload", lambda p: plots.workload_lengths([r.prompt_tokens for r in reqs],
                                                                   [r.output_tokens for r in reqs], p))):
        path = fn(out_dir / f"{name}.png")
        if path is not None:
            plot_paths[name] = str(path)
    details = {"workload": w.to_dict(), "curve": curve.to_dict(), "engine": engine_stats.to_dict(),
               "diagnostic_step": _step_dict(step), "profile": prof.to_dict() if prof else None,
               "probes": [r.to_dict() for r in probe_results], "resolved_config": _jsonable(resolved),
               "capacity": capacity.to_dict() if hasattr(capacity, "to_dict") else capacity}
    meta = {"engine": getattr(engine, "name", type(engine).__name__), "engine_version": version,
            "measurement": plan.name, "quick": quick,
            "n_requests": len(reqs), "wall_s": time.perf_counter() - t0, "seed": seed,
            "pool_hash": _safe_hash(pool), "profile": profile_note or "ok"}
    return DiagnosticReport(endpoint=endpoint.name, config=dict(config), hypotheses=hyps, findings=findings,
                            features=features, plots=plot_paths, details=details, meta=meta)


def _step_dict(step: Any) -> dict[str, Any]:
    return step.to_dict() if hasattr(step, "to_dict") else asdict(step)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (str, int, float, bool, type(None)))}


def _safe_hash(pool: Any) -> str | None:
    try:
        return pool.content_hash
    except (KeyError, AttributeError):
        return None


def top_hypotheses_text(report: DiagnosticReport, n: int = 3) -> str:
    """Short console summary of the top hypotheses."""
    lines = []
    for i, h in enumerate(report.hypotheses[:n], 1):
        ev = h.evidence[0] if h.evidence else "no evidence"
        ev = re.sub(r"\s*\[.*?\]$", "", ev)
        lines.append(f"{i}. {h.bottleneck} [{h.direction}] score {h.score:.2f} — {ev}; try {', '.join(h.knobs[:3])}")
    return "\n".join(lines)
