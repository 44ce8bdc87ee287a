"""Owns engine-metric analysis: the time-series summary of SGLang's metrics (``loadgen.prometheus`` reads them).

Input is either scraped ``/metrics`` snapshots (SGLang or the emulator's HTTP server) or the
in-process ``StepOutcome.engine_timeseries`` dicts, which use the same metric names. The summary
answers the diagnosis questions: does the queue grow, how many requests run, how full is the KV
pool, are requests retracted, how much prompt is served from cache, how long are accepted
speculative drafts, and how often the decode batch exceeds the CUDA-graph max batch size.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

from autoresearch_dagster.loadgen.prometheus import PREFIX, snapshot

_TIME_KEYS = ("t", "time_s", "timestamp", "ts")


def _norm(sample: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in sample.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[k if (":" in k or k in _TIME_KEYS) else PREFIX + k] = float(v)
    return out


def _time(sample: dict[str, float], i: int) -> float:
    for k in _TIME_KEYS:
        if k in sample:
            return sample[k]
    return float(i)


@dataclass
class EngineStats:
    n_samples: int
    queue_mean: float | None
    queue_p95: float | None
    queue_max: float | None
    queue_slope_per_s: float | None  # least-squares growth of the waiting queue over the run
    running_mean: float | None
    running_p50: float | None
    running_max: float | None
    token_usage_mean: float | None
    token_usage_max: float | None
    retractions: float | None  # retracted requests during the run (counter delta)
    aborted: float | None
    cache_hit_rate: float | None  # cached prompt tokens / prompt tokens over the run
    spec_accept_length: float | None
    max_running_requests: int | None  # resolved cap
    cuda_graph_max_bs: int | None  # resolved decode CUDA-graph max batch size
    share_at_running_cap: float | None  # share of samples with running ≥ 95% of the cap
    share_above_graph_bs: float | None  # share of busy samples whose decode batch exceeds the graph max bs
    share_queue_nonempty: float | None
    at_cap_when_queued: float | None  # of the samples with requests waiting: share with the running batch at its cap
    usage_when_queued: float | None  # mean KV token usage over the samples with requests waiting

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _series(samples: list[dict[str, float]], name: str) -> np.ndarray | None:
    vals = [s[PREFIX + name] for s in samples if PREFIX + name in s and math.isfinite(s[PREFIX + name])]
    return np.array(vals, dtype=float) if vals else None


def _delta(samples: list[dict[str, float]], name: str) -> float | None:
    vals = _series(samples, name)
    if vals is None:
        return None
    return float(vals[-1] - vals[0]) if len(vals) > 1 else float(vals[-1])


def _first(*vals: float | None) -> float | None:
    return next((v for v in vals if v is not None), None)


def analyze_timeseries(samples: Iterable[dict[str, Any] | str], resolved_config: dict[str, Any] | None = None) -> EngineStats:
    """Summarize engine metrics over a run. Items are dicts (metric → value, optional 't') or /metrics texts."""
    rows = [_norm(snapshot(s)) if isinstance(s, str) else _norm(s) for s in samples]
    cfg = resolved_config or {}
    q = _series(rows, "num_queue_reqs")
    run = _series(rows, "num_running_reqs")
    usage = _series(rows, "token_usage")
    slope = None
    if q is not None and len(q) >= 3:
        ts = np.array([_time(r, i) for i, r in enumerate(rows) if PREFIX + "num_queue_reqs" in r])
        if np.ptp(ts) > 0:
            slope = float(np.polyfit(ts, q, 1)[0])
    cached = _delta(rows, "cached_tokens_total")
    prompt = _delta(rows, "prompt_tokens_total")
    if cached is not None and prompt:
        hit = cached / prompt
    else:
        h = _series(rows, "cache_hit_rate")
        hit = float(np.mean(h)) if h is not None else None
    acc = _series(rows, "spec_accept_length")
    mrr = cfg.get("max_running_requests")
    gbs = cfg.get("cuda_graph_max_bs_decode")
    at_cap = above = at_cap_q = usage_q = None
    if run is not None and mrr:
        at_cap = float(np.mean(run >= 0.95 * float(mrr)))
    # Why requests wait: read the gauges only at the samples where some did.
    both = [(r[PREFIX + "num_queue_reqs"], r.get(PREFIX + "num_running_reqs"), r.get(PREFIX + "token_usage"))
            for r in rows if PREFIX + "num_queue_reqs" in r]
    queued = [(run_, use) for q_, run_, use in both if q_ > 0]
    if queued and mrr:
        at_cap_q = float(np.mean([run_ is not None and run_ >= 0.95 * float(mrr) for run_, _ in queued]))
    elif both and mrr:
        at_cap_q = 0.0  # nobody waited: the cap held no one back
    if queued and any(use is not None for _, use in queued):
        usage_q = float(np.mean([use for _, use in queued if use is not None]))
    # The decode batch itself when the engine reports it; the running count is an upper bound of it.
    dbs = _series(rows, "decode_batch_size")
    dbs = dbs if dbs is not None else run
    if dbs is not None and gbs:
        busy = dbs[dbs > 0]
        if busy.size:
            above = float(np.mean(busy > float(gbs)))
    eager, graph = _delta(rows, "eager_passes_total"), _delta(rows, "cuda_graph_passes_total")
    if eager is not None and graph is not None and eager + graph > 0:
        above = eager / (eager + graph)
    return EngineStats(
        n_samples=len(rows),
        queue_mean=float(q.mean()) if q is not None else None,
        queue_p95=float(np.percentile(q, 95)) if q is not None else None,
        queue_max=float(q.max()) if q is not None else None,
        queue_slope_per_s=slope,
        running_mean=float(run.mean()) if run is not None else None,
        running_p50=float(np.median(run)) if run is not None else None,
        running_max=float(run.max()) if run is not None else None,
        token_usage_mean=float(usage.mean()) if usage is not None else None,
        token_usage_max=float(usage.max()) if usage is not None else None,
        retractions=_first(_delta(rows, "num_retracted_requests_total"), _delta(rows, "num_retracted_reqs_total")),
        aborted=_delta(rows, "num_aborted_requests_total"),
        cache_hit_rate=hit,
        spec_accept_length=float(acc[acc > 0].mean()) if acc is not None and (acc > 0).any() else None,
        max_running_requests=int(mrr) if mrr else None,
        cuda_graph_max_bs=int(gbs) if gbs else None,
        share_at_running_cap=at_cap, share_above_graph_bs=above,
        share_queue_nonempty=float(np.mean(q > 0)) if q is not None else None,
        at_cap_when_queued=at_cap_q, usage_when_queued=usage_q,
    )
