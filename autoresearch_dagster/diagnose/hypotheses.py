"""Owns bottleneck hypotheses: the catalog (bottleneck → research direction, knobs) and evidence-based scoring.

Scoring reads only measured features (workload statistics, the load curve, engine metrics, the
profile, probe results) plus the resolved server config, never the name of a scenario. Each
bottleneck lists its signals: a feature, a ramp (the value where the signal starts and where it is
full) and a weight. Its score is the weighted share of its signals that fired, over the signals
whose feature was measured, damped by how much of its expected evidence was available at all:
``score = (Σ wᵢ·sᵢ / Σ_measured wᵢ) · (0.5 + 0.5 · Σ_measured wᵢ / Σ wᵢ) · (0.2 + 0.8 · gate)``, where
``gate`` is the strongest of the bottleneck's key (defining) signals, 0.5 when none was measured; each
measured ``need`` signal (a precondition, such as the SLA term the bottleneck explains having broken)
scales the score by ``0.3 + 0.7·s``. Probe recipes add
signals to a bottleneck from their YAML (``supports:``), so a new probe needs no code.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autoresearch_dagster.spec import Direction


@dataclass(frozen=True)
class Bottleneck:
    name: str
    direction: Direction
    knobs: tuple[str, ...]
    summary: str


BOTTLENECKS: dict[str, Bottleneck] = {b.name: b for b in [
    Bottleneck("prefill_interference", "scheduling_cache",
               ("chunked_prefill_size", "prefill_decode_interval", "enable_mixed_chunk", "max_prefill_tokens"),
               "long prefill steps stall running decodes: ITL/TPOT tails grow when long prompts arrive"),
    Bottleneck("kv_capacity", "parallel_admission",
               ("mem_fraction_static", "kv_cache_dtype", "schedule_conservativeness", "tp_size"),
               "the KV pool fills: admission stops, requests are retracted, the queue grows"),
    Bottleneck("cuda_graph_coverage", "kernels_quant",
               ("cuda_graph_max_bs_decode", "max_running_requests"),
               "decode batches exceed the largest CUDA graph and run eagerly: launch overhead per step"),
    Bottleneck("missed_prefix_reuse", "scheduling_cache",
               ("disable_radix_cache", "schedule_policy", "page_size"),
               "the traffic repeats prefixes the engine does not reuse: prefill recomputes cached tokens"),
    Bottleneck("decode_bound_small_batch", "speculative",
               ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                "speculative_num_draft_tokens"),
               "per-token latency is near the limit even at light load: decode is weight-read bound"),
    Bottleneck("admission_limit", "parallel_admission",
               ("max_running_requests", "schedule_conservativeness", "cuda_graph_max_bs_decode"),
               "the running batch sits at max_running_requests with memory to spare while requests queue"),
    Bottleneck("burst_queueing", "parallel_admission",
               ("dp_size", "tp_size", "max_running_requests", "chunked_prefill_size"),
               "arrivals come in bursts: queues build during bursts though the mean load fits"),
    Bottleneck("compute_bound_prefill", "kernels_quant",
               ("quantization", "kv_cache_dtype", "chunked_prefill_size"),
               "prefill compute dominates: TTFT grows with prompt length, GEMMs fill the prefill time"),
]}

@dataclass(frozen=True)
class Signal:
    feature: str  # key in the feature dict
    lo: float  # value at which the signal starts (0)
    hi: float  # value at which it is full (1); lo > hi means "lower is worse"
    weight: float
    label: str  # how the evidence line reads
    key: bool = False  # a defining symptom: without any key signal the hypothesis is damped
    need: bool = False  # a precondition (e.g. the SLA term it explains broke): scales the score by 0.3 + 0.7·s

    def strength(self, value: float) -> float:
        if self.hi == self.lo:
            return 1.0 if value >= self.hi else 0.0
        s = (value - self.lo) / (self.hi - self.lo)
        return max(0.0, min(1.0, s))


# Features are floats (booleans as 0/1). Names: w.* workload, c.* curve, m.* engine metrics at the
# overload step, cfg.* resolved config, p.* profile, probe.<name> probe signals.
SIGNALS: dict[str, list[Signal]] = {
    "prefill_interference": [
        Signal("c.breaks_tpot_itl", 0.0, 1.0, 1.5, "an ITL/TPOT term breaks first", need=True),
        Signal("c.itl_tail_ratio", 2.0, 6.0, 2.0, "ITL p99/p50 at the break step", key=True),
        Signal("p.decode_stall_ratio", 2.0, 8.0, 2.0, "an interrupting prefill step lasts this many decode steps", key=True),
        Signal("w.share_long_prompts", 0.02, 0.15, 1.0, "share of prompts ≥ 4096 tokens"),
    ],
    "kv_capacity": [
        Signal("m.token_usage_max", 0.85, 0.97, 3.0, "peak KV token usage", key=True),
        Signal("m.retractions", 0.0, 5.0, 2.0, "requests retracted under KV pressure", key=True),
        Signal("m.usage_when_queued", 0.7, 0.92, 2.0, "mean KV token usage while requests wait", key=True),
    ],
    "cuda_graph_coverage": [
        Signal("m.share_above_graph_bs", 0.1, 0.6, 3.0, "share of decode samples with batch > CUDA-graph max bs", key=True),
        Signal("p.launch_gap_share", 0.05, 0.25, 1.5, "share of GPU time lost in short launch gaps"),
        Signal("c.per_token_regime", 0.0, 1.0, 1.0, "per-token time grows with load"),
    ],
    "missed_prefix_reuse": [
        Signal("x.cache_gap", 0.1, 0.4, 3.0, "prefix-cache hit rate the workload allows minus the one measured", key=True),
        Signal("w.prefix_hit_rate", 0.1, 0.5, 1.0, "infinite-cache prefix hit rate of the workload", need=True),
        Signal("c.breaks_ttft", 0.0, 1.0, 0.5, "TTFT breaks first"),
    ],
    "decode_bound_small_batch": [
        Signal("c.tpot_headroom_low", 0.45, 0.8, 3.0, "TPOT at the lightest load relative to its SLA limit", key=True),
        Signal("c.breaks_tpot_itl", 0.0, 1.0, 1.0, "an ITL/TPOT term breaks first", need=True),
        Signal("x.no_speculation", 0.0, 1.0, 0.5, "no speculative decoding running"),
        Signal("m.running_small", 0.0, 1.0, 0.5, "decode batch at the break stays small (≤ 32)"),
    ],
    "admission_limit": [
        Signal("m.at_cap_when_queued", 0.4, 0.9, 3.0,
               "while requests wait, share of time the running batch is at max_running_requests", key=True),
        Signal("m.queue_nonempty", 0.2, 0.7, 1.0, "share of samples with requests waiting"),
        Signal("m.kv_headroom", 0.1, 0.4, 1.5, "KV pool left unused at peak (1 − token usage)"),
    ],
    "burst_queueing": [
        Signal("w.interarrival_cv", 1.3, 2.5, 2.0, "coefficient of variation of inter-arrival times", key=True),
        Signal("w.dispersion_index", 2.0, 8.0, 1.5, "index of dispersion of arrivals per window", key=True),
        Signal("c.breaks_ttft", 0.0, 1.0, 0.5, "TTFT breaks first"),
    ],
    "compute_bound_prefill": [
        Signal("c.breaks_ttft", 0.0, 1.0, 1.0, "TTFT breaks first", need=True),
        Signal("c.ttft_headroom_low", 0.15, 0.5, 1.5, "TTFT at the lightest load relative to its SLA limit", key=True),
        Signal("p.prefill_gemm_share", 0.3, 0.6, 1.5, "GEMM/MoE share of GPU time × prefill share of step time", key=True),
        Signal("w.prompt_output_ratio", 5.0, 30.0, 1.0, "prompt tokens per output token"),
        Signal("x.no_fp8", 0.0, 1.0, 0.5, "weights not in fp8"),
    ],
}


@dataclass
class Hypothesis:
    bottleneck: str
    direction: str
    score: float
    evidence: list[str]
    knobs: list[str]
    summary: str = ""
    coverage: float = 0.0  # share of this bottleneck's expected evidence that was measured

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def derive_features(base: dict[str, float | None]) -> dict[str, float | None]:
    """Cross-source features computed from the measured ones (kept here so scoring stays declarative)."""
    f = dict(base)

    def g(k: str) -> float | None:
        v = f.get(k)
        return None if v is None else float(v)

    pot = g("m.potential_hit_rate") if f.get("m.potential_hit_rate") is not None else g("w.prefix_hit_rate")
    hit = g("m.cache_hit_rate")
    f["x.cache_gap"] = (pot - hit) if pot is not None and hit is not None else None
    usage = g("m.token_usage_max")
    f["m.kv_headroom"] = (1.0 - usage) if usage is not None else None
    acc = g("m.spec_accept_length")
    spec = f.get("cfg.speculative")
    f["x.no_speculation"] = None if spec is None else (0.0 if (spec or (acc or 0) > 1.0) else 1.0)
    fp8 = f.get("cfg.fp8")
    f["x.no_fp8"] = None if fp8 is None else 1.0 - float(fp8)
    run = g("m.running_mean")
    f["m.running_small"] = None if run is None else (1.0 if run <= 32 else 0.0)
    gemm, pre = g("p.gemm_share"), g("p.prefill_time_share")
    f["p.prefill_gemm_share"] = (gemm * pre) if gemm is not None and pre is not None else None
    return f


def score(features: dict[str, float | None], extra: dict[str, list[Signal]] | None = None,
          sources: dict[str, str] | None = None) -> list[Hypothesis]:
    """Rank the bottlenecks by their evidence. ``extra`` adds signals (from probe recipes) per bottleneck;
    ``sources`` maps a feature to where it was measured (shown in the evidence lines)."""
    feats = derive_features(features)
    sources = sources or {}
    out: list[Hypothesis] = []
    for name, b in BOTTLENECKS.items():
        sigs = SIGNALS[name] + (extra or {}).get(name, [])
        total = sum(s.weight for s in sigs)
        measured = 0.0
        got = 0.0
        lines: list[tuple[float, str]] = []
        for s in sigs:
            v = feats.get(s.feature)
            if v is None:
                continue
            measured += s.weight
            st = s.strength(float(v))
            got += s.weight * st
            if st > 0:
                where = sources.get(s.feature, s.feature.split(".")[0])
                lines.append((s.weight * st, f"{s.label}: {_fmt(float(v))} [{where}; signal {st:.2f}×{s.weight:g}]"))
        gates = [s.strength(float(feats[s.feature])) for s in sigs if s.key and feats.get(s.feature) is not None]
        gate = max(gates) if gates else 0.5
        sc = (got / measured) * (0.5 + 0.5 * measured / total) * (0.2 + 0.8 * gate) if measured > 0 else 0.0
        for s in sigs:
            if s.need and feats.get(s.feature) is not None:
                sc *= 0.3 + 0.7 * s.strength(float(feats[s.feature]))
        lines.sort(key=lambda x: -x[0])
        out.append(Hypothesis(bottleneck=name, direction=b.direction, score=round(sc, 4),
                              evidence=[text for _, text in lines], knobs=list(b.knobs), summary=b.summary,
                              coverage=round(measured / total, 3) if total else 0.0))
    out.sort(key=lambda h: (-h.score, h.bottleneck))
    return out


def probe_signals(recipes: list[Any], results: dict[str, dict[str, float | None]]
                  ) -> tuple[dict[str, list[Signal]], dict[str, float | None]]:
    """Signals declared by probe recipes (``supports:``) and their feature values ``probe.<name>.<key>``."""
    extra: dict[str, list[Signal]] = {}
    feats: dict[str, float | None] = {}
    for r in recipes:
        if r.name not in results:
            continue
        for sig in r.signals:
            key = r.feature(sig["key"])
            feats[key] = results[r.name].get(sig["key"])
            for sup in sig.get("supports") or []:
                extra.setdefault(sup["bottleneck"], []).append(
                    Signal(key, float(sup["low"]), float(sup["high"]), float(sup.get("weight", 1.0)),
                           f"probe {r.name}: {sig.get('label', sig['key'])}", key=bool(sup.get("key", False))))
    return extra, feats
