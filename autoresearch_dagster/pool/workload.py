"""Owns workload statistics of a replay pool: lengths, prefix reuse, burstiness, tools, structure, turns.

Reads ``PoolRequest``s (from ``ReplayPool.iter_requests`` or an in-memory list). Prefix reuse is
the infinite-cache view: requests in arrival order, each reusing the longest prefix of block
hashes any earlier request produced (the radix cache with unlimited memory, no eviction).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

LONG_PROMPT_TOKENS = 4096
SHORT_OUTPUT_TOKENS = 64
_Q = (50, 90, 99)


@dataclass
class SharedPrefix:
    prefix_tokens: int
    requests: int  # requests that reused this prefix (as their longest cached match)
    tokens_saved: int


@dataclass
class WorkloadStats:
    n_requests: int
    duration_s: float
    mean_rate_rps: float
    prompt_tokens: dict[str, float]  # mean, p50, p90, p99, max
    output_tokens: dict[str, float]
    share_long_prompts: float  # prompt ≥ LONG_PROMPT_TOKENS
    share_short_outputs: float  # output ≤ SHORT_OUTPUT_TOKENS
    prompt_output_ratio: float  # total prompt tokens / total output tokens
    prefix_hit_rate: float  # infinite-cache share of prompt tokens served from cache
    top_prefixes: list[SharedPrefix]
    interarrival_cv: float | None
    dispersion_index: float | None  # variance/mean of arrivals per window (1 for Poisson)
    dispersion_window_s: float | None
    share_tools: float
    share_structured: float
    conversations: int
    turns_mean: float | None
    turns_max: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dist(vals: np.ndarray) -> dict[str, float]:
    if vals.size == 0:
        return {"mean": 0.0, **{f"p{q}": 0.0 for q in _Q}, "max": 0.0}
    return {"mean": float(vals.mean()), **{f"p{q}": float(np.percentile(vals, q)) for q in _Q}, "max": float(vals.max())}


def prefix_reuse(requests: list[Any], top: int = 5) -> tuple[float, list[SharedPrefix]]:
    """Infinite-cache hit rate over block hashes and the shared prefixes that save the most tokens.

    Takes PoolRequests (ordered by ``arrival_s``) or ScheduledRequests (ordered by ``send_offset_s``)."""
    seen: set[int] = set()
    saved_by: dict[tuple[int, int], list[int]] = {}
    total = hit = 0
    for r in sorted(requests, key=lambda r: getattr(r, "arrival_s", None) or getattr(r, "send_offset_s", 0.0)):
        total += r.prompt_tokens
        hashes = list(r.block_hashes or [])
        depth = 0
        for h in hashes:
            if h not in seen:
                break
            depth += 1
        if depth:
            tokens = min(depth * r.block_tokens, r.prompt_tokens)
            hit += tokens
            key = (hashes[depth - 1], depth)
            saved_by.setdefault(key, [0, 0])
            saved_by[key][0] += 1
            saved_by[key][1] += tokens
        seen.update(hashes)
    block = next((r.block_tokens for r in requests), 0)
    ranked = sorted(saved_by.items(), key=lambda kv: -kv[1][1])[:top]
    return (hit / total if total else 0.0,
            [SharedPrefix(prefix_tokens=depth * block, requests=n, tokens_saved=s) for (_, depth), (n, s) in ranked])


def burstiness(arrivals: np.ndarray) -> tuple[float | None, float | None, float | None]:
    """(CV of inter-arrivals, index of dispersion of counts, window used). Windows hold ~10 arrivals on average."""
    if arrivals.size < 3:
        return None, None, None
    t = np.sort(arrivals)
    gaps = np.diff(t)
    cv = float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else None
    span = float(t[-1] - t[0])
    if span <= 0:
        return cv, None, None
    window = span / max(t.size / 10.0, 1.0)
    n_win = int(span // window)
    if n_win < 3:
        return cv, None, None
    counts = np.histogram(t, bins=n_win, range=(t[0], t[0] + n_win * window))[0]
    idx = float(counts.var() / counts.mean()) if counts.mean() > 0 else None
    return cv, idx, window


def workload_stats(requests: Iterable[Any]) -> WorkloadStats:
    """Statistics of the pool's requests (pass ``pool.iter_requests("serving")`` or a list of PoolRequests)."""
    reqs = list(requests)
    if not reqs:
        raise ValueError("workload statistics need at least one request; the pool's serving split is empty")
    p = np.array([r.prompt_tokens for r in reqs], dtype=float)
    o = np.array([r.output_tokens for r in reqs], dtype=float)
    arr = np.array([r.arrival_s for r in reqs], dtype=float)
    duration = float(arr.max() - arr.min())
    hit, top = prefix_reuse(reqs)
    cv, disp, win = burstiness(arr)
    convs: dict[str, int] = {}
    for r in reqs:
        if r.conversation_id:
            convs[r.conversation_id] = convs.get(r.conversation_id, 0) + 1  # turns seen in the pool
    turns = np.array(list(convs.values()), dtype=float)
    return WorkloadStats(
        n_requests=len(reqs), duration_s=duration,
        mean_rate_rps=(len(reqs) - 1) / duration if duration > 0 else 0.0,
        prompt_tokens=_dist(p), output_tokens=_dist(o),
        share_long_prompts=float(np.mean(p >= LONG_PROMPT_TOKENS)),
        share_short_outputs=float(np.mean(o <= SHORT_OUTPUT_TOKENS)),
        prompt_output_ratio=float(p.sum() / o.sum()) if o.sum() > 0 else float("inf"),
        prefix_hit_rate=hit, top_prefixes=top,
        interarrival_cv=cv, dispersion_index=disp, dispersion_window_s=win,
        share_tools=float(np.mean([bool(r.tools) for r in reqs])),
        share_structured=float(np.mean([bool(r.response_format) for r in reqs])),
        conversations=len(convs),
        turns_mean=float(turns.mean()) if turns.size else None,
        turns_max=int(turns.max()) if turns.size else None,
    )
