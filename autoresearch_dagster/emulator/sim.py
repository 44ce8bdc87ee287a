"""Owns the emulator's virtual-time drivers: run an ``EngineCore`` over a list of timed requests
(``simulate``, open loop) or keep a fixed number of requests in flight (``simulate_closed_loop``, what
``vllm bench serve --max-concurrency`` and ``sglang.bench_serving --max-concurrency`` do).

No sleeping and no per-token objects: between arrivals the core runs its iterations back to back
(``EngineCore.run_until``), engine metrics are sampled on a fixed virtual-time grid, and each
request's token times are read from the core's compact decode-step log at the end.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoresearch_dagster.emulator.core import EmuRequest, EngineCore

TIMESERIES_KEYS = ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage",
                   "sglang:cache_hit_rate", "sglang:num_retracted_requests_total", "sglang:spec_accept_length",
                   "sglang:gen_throughput", "sglang:decode_batch_size", "sglang:new_token_ratio",
                   "sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:cached_tokens_total")


@dataclass
class RequestResult:
    rid: str
    arrival_s: float
    first_token_s: float | None
    end_s: float | None
    output_tokens: int
    cached_tokens: int | None
    status: str  # ok | error | timeout
    error: str | None
    token_times: np.ndarray  # absolute virtual time of every output event (first token included)
    token_counts: np.ndarray  # tokens delivered at each event (>1 under speculative decoding)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.arrival_s

    def chunk_times(self, stream_interval: int = 1) -> np.ndarray:
        """Times a streaming client sees chunks: the first token, then every ``stream_interval`` tokens, and the end."""
        t = self.token_times
        if len(t) <= 1 or stream_interval <= 1:
            return t
        cum = np.cumsum(self.token_counts)
        step = cum // stream_interval
        sent = np.empty(len(t), dtype=bool)
        sent[0] = True
        sent[1:] = step[1:] > step[:-1]
        sent[-1] = True
        return t[sent]

    def itl_s(self, stream_interval: int = 1) -> np.ndarray:
        return np.diff(self.chunk_times(stream_interval))


@dataclass
class SimResult:
    requests: list[RequestResult]
    timeseries: list[dict[str, float]]
    start_s: float
    end_s: float
    wall_s: float
    stream_interval: int
    profile: dict | None = None
    final_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return int(sum(r.output_tokens for r in self.requests))

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.requests if r.status == "ok"]
        ttft = np.array([r.ttft_s for r in ok]) if ok else np.zeros(1)
        itl = np.concatenate([r.itl_s(self.stream_interval) for r in ok] or [np.zeros(1)])
        tpot = np.array([(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1] or [0.0])
        pct = lambda a, q: float(np.percentile(a, q)) if len(a) else math.nan  # noqa: E731
        return {"n": len(self.requests), "ok": len(ok),
                "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99),
                "tpot_p50": pct(tpot, 50), "tpot_p99": pct(tpot, 99),
                "duration_s": self.end_s - self.start_s, "generated_tokens": self.generated_tokens}


def simulate(core: EngineCore, requests: list[EmuRequest], *, sample_interval_s: float = 1.0,
             deadline_s: float | None = None, profile_window: tuple[float, float] | None = None,
             start_s: float | None = None) -> SimResult:
    """Run ``requests`` (arrival_s = absolute virtual time) through ``core`` until all finish.

    Requests still unfinished at ``deadline_s`` are aborted and reported as timeouts. Engine
    metrics are sampled every ``sample_interval_s``; ``profile_window`` (start, end) records a
    Chrome-trace profile of the steps in that window.
    """
    wall0 = time.perf_counter()
    reqs = sorted(requests, key=lambda r: r.arrival_s)
    t0 = start_s if start_s is not None else (reqs[0].arrival_s if reqs else 0.0)
    deadline = math.inf if deadline_s is None else deadline_s
    samples: list[dict[str, float]] = []
    next_sample = t0 + sample_interval_s if sample_interval_s > 0 else math.inf
    prof_start, prof_end = profile_window if profile_window else (math.inf, math.inf)
    profile: dict | None = None

    def advance_to(t: float) -> None:
        nonlocal next_sample, prof_start, prof_end, profile
        while True:
            nxt = min(next_sample, prof_start, prof_end)
            if nxt > t:
                break
            core.run_until(nxt)
            if nxt == prof_start:
                core.start_profile()
                prof_start = math.inf
            elif nxt == prof_end:
                profile = core.stop_profile()
                prof_end = math.inf
            else:
                m = core.metrics()
                samples.append({"t": nxt - t0, **{k: m.get(k, 0.0) for k in TIMESERIES_KEYS}})
                next_sample += sample_interval_s
        core.run_until(t)

    for r in reqs:
        if r.arrival_s > deadline:
            break
        advance_to(r.arrival_s)
        core.add_request(r, r.arrival_s)
    # drain: keep sampling while work remains
    while True:
        nf = core.next_free_s()
        if nf is None or nf >= deadline:
            break
        advance_to(min(max(nf, next_sample), deadline))
        if next_sample > deadline and core.next_free_s() is not None:
            core.run_until(deadline)
            break
    if profile_window and profile is None and core._profiling:
        profile = core.stop_profile()
    finished = core.pop_finished()
    done_ids = {r.rid for r in finished}
    results: list[RequestResult] = []
    end_t = t0
    for r in finished:
        times, counts = core.token_times(r)
        results.append(RequestResult(r.rid, r.arrival, r.first_s, r.finish_s, int(counts.sum()) if len(counts) else 0,
                                     r.cached_reported, r.status, r.error, times, counts))
        if r.finish_s is not None:
            end_t = max(end_t, r.finish_s)
    for rq in reqs:
        if rq.rid in done_ids:
            continue
        r = core._by_rid.get(rq.rid)
        if r is None:  # never admitted before the deadline
            results.append(RequestResult(rq.rid, rq.arrival_s, None, None, 0, None, "timeout", "deadline",
                                         np.zeros(0), np.zeros(0, dtype=np.int64)))
            continue
        core.abort(rq.rid)
        times, counts = core.token_times(r)
        results.append(RequestResult(r.rid, r.arrival, r.first_s, None, int(counts.sum()) if len(counts) else 0,
                                     r.cached_reported, "timeout", "deadline", times, counts))
    core.pop_finished()
    if math.isfinite(deadline) and len(results) > len(done_ids):
        end_t = max(end_t, deadline)
    return SimResult(results, samples, t0, end_t, time.perf_counter() - wall0,
                     core.knobs["stream_interval"], profile, core.metrics())


def simulate_closed_loop(core: EngineCore, requests: list[EmuRequest], concurrency: int) -> SimResult:
    """Send ``requests`` in order, ``concurrency`` at a time: each finished request's client sends the next
    one when it has seen the last token (``EmuRequest.arrival_s`` is ignored). Runs until all finish."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    wall0 = time.perf_counter()
    todo = list(reversed(requests))
    sends: list[tuple[float, int]] = [(0.0, i) for i in range(min(concurrency, len(todo)))]
    seq = len(sends)
    results: list[RequestResult] = []
    end_t = 0.0
    while sends or core.next_free_s() is not None:
        nf = core.next_free_s()
        if sends and (nf is None or sends[0][0] <= nf):
            t, _ = heapq.heappop(sends)
            r = todo.pop()
            core.add_request(EmuRequest(r.rid, r.prompt_tokens, r.output_tokens, r.block_hashes, r.block_tokens, t), t)
            continue
        core.next_step(nf)
        for f in core.pop_finished():
            times, counts = core.token_times(f)
            results.append(RequestResult(f.rid, f.arrival, f.first_s, f.finish_s, int(counts.sum()) if len(counts) else 0,
                                         f.cached_reported, f.status, f.error, times, counts))
            done = f.finish_s if f.finish_s is not None else nf
            end_t = max(end_t, done)
            if len(todo) > len(sends):  # a request is left that no pending send will take
                heapq.heappush(sends, (done, seq))
                seq += 1
    return SimResult(results, [], 0.0, end_t, time.perf_counter() - wall0, core.knobs["stream_interval"], None,
                     core.metrics())
