"""Owns workload statistics of a request stream: lengths, prefix reuse, arrivals, concurrency, structure.

One ``WorkloadStats`` serves replay fidelity (a source log against its pool, ``pool.fidelity``) and
diagnosis (a pool's serving split, ``diagnose.report``). It is fed in arrival order and keeps
bounded memory: arrival, concurrency and prefix statistics are streaming, token lengths keep exact
sums and a hash-chosen sample. ``workload_stats(requests)`` feeds it a list of ``PoolRequest``s and
adds what needs the requests in memory (the shared prefixes that save most, the dispersion index
over windows of about ten arrivals).

Prefix hit rate, the one definition: the share of prompt *tokens* an infinite prefix cache (a
radix cache with unlimited memory, no eviction) would serve, requests in arrival order. A block
hits when its chained hash appeared in an earlier request (chained hashes make that its whole
prefix) and counts ``block_tokens`` tokens; the denominator is every prompt token, tails shorter
than a block included. Token-weighted because that is what the engine reports (SGLang's
``cache_hit_rate`` = cached / prompt tokens) and diagnosis sets the two side by side; the other
candidate, the share of block hashes seen before (1 - distinct / total blocks), leaves the tails
out and so overstates reuse on short prompts. A hashed partial last block (token traces) counts as
a whole block, so the rate is capped at 1.
"""
from __future__ import annotations

import heapq
from array import array
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

from autoresearch_dagster.pool.schema import mix64, mix64_np

LONG_PROMPT_TOKENS = 4096
SHORT_OUTPUT_TOKENS = 64
_Q = (50, 90, 99)


@dataclass
class SharedPrefix:
    prefix_tokens: int
    requests: int  # requests that reused this prefix (as their longest cached match)
    tokens_saved: int


class PrefixCache:
    """Repeated blocks of an infinite prefix cache over chained block hashes, in bounded memory.

    With an infinite cache every distinct hash misses once and hits on every later occurrence, so
    hits = total - distinct. ``total`` is exact; ``distinct`` is exact until ``max_tracked``
    distinct hashes, then estimated from the hashes whose mixed value falls in a shrinking sample
    (adaptive hash sampling: relative error about 1/sqrt(max_tracked)).
    """

    def __init__(self, max_tracked: int = 2_000_000) -> None:
        self._seen: set[int] = set()
        self.total = 0
        self.level = 0  # tracked hashes: mix(h) % 2**level == 0
        self.max_tracked = max_tracked

    def _shrink(self) -> None:
        while len(self._seen) > self.max_tracked:
            self.level += 1
            mask = (1 << self.level) - 1
            self._seen = {h for h in self._seen if mix64(h) & mask == 0}

    def add(self, hashes: Iterable[int]) -> None:
        if self.level == 0:
            if not isinstance(hashes, (list, tuple)):
                hashes = list(hashes)
            self.total += len(hashes)
            self._seen.update(hashes)
        else:
            mask = (1 << self.level) - 1
            for h in hashes:
                self.total += 1
                if mix64(h) & mask == 0:
                    self._seen.add(h)
        if len(self._seen) > self.max_tracked:
            self._shrink()

    def add_flat(self, hashes: np.ndarray, unique: np.ndarray | None = None) -> None:
        """The hashes of many requests at once (``unique``: np.unique of them, if already known)."""
        if not len(hashes):
            return
        self.total += len(hashes)
        u = np.unique(hashes) if unique is None else unique
        if self.level:
            u = u[(mix64_np(u) & np.uint64((1 << self.level) - 1)) == 0]
        self._seen.update(u.tolist())
        if len(self._seen) > self.max_tracked:
            self._shrink()

    @property
    def distinct(self) -> float:
        return len(self._seen) * float(1 << self.level)

    @property
    def hits(self) -> float:
        """Blocks served from the cache (an estimate once the distinct hashes are sampled)."""
        return max(0.0, self.total - self.distinct)


def hit_rate(hit_blocks: float, block_tokens: int, prompt_tokens: int) -> float:
    """The prefix hit rate (module docstring): cached tokens over all prompt tokens."""
    return min(1.0, hit_blocks * block_tokens / prompt_tokens) if prompt_tokens else 0.0


class Arrivals:
    """Streaming arrival statistics of in-order arrivals: count, span, inter-arrival moments, window counts."""

    MAX_BINS = 10_000_000

    def __init__(self, windows: tuple[float, ...]) -> None:
        self.n = 0
        self.first = self.last = 0.0
        self.gap_sum = self.gap_sq = 0.0
        self.windows = windows
        self.bins: dict[float, array | None] = {w: array("q") for w in windows}

    def _counts(self, w: float, top: int) -> array | None:
        counts = self.bins[w]
        if counts is not None and top > len(counts):
            if top > self.MAX_BINS:
                self.bins[w] = None  # span too long for windows this small
                return None
            counts.frombytes(bytes(8 * max(top - len(counts), len(counts))))
        return counts

    def add_one(self, t: float) -> None:
        if self.n == 0:
            self.first = self.last = t
        t = max(t, self.last)  # arrivals come in order; guard against disorder
        gap = t - self.last
        self.gap_sum += gap
        self.gap_sq += gap * gap
        self.n += 1
        self.last = t
        for w in self.windows:
            i = int((t - self.first) // w)
            counts = self._counts(w, i + 1)
            if counts is not None:
                counts[i] += 1

    def add(self, t: np.ndarray) -> None:
        if not len(t):
            return
        if self.n == 0:
            self.first = self.last = float(t[0])
        t = np.maximum.accumulate(np.maximum(np.asarray(t, np.float64), self.last))
        gaps = np.diff(np.concatenate([[self.last], t]))
        self.gap_sum += float(gaps.sum())
        self.gap_sq += float((gaps * gaps).sum())
        self.n += len(t)
        self.last = float(t[-1])
        for w in self.windows:
            idx = ((t - self.first) // w).astype(np.int64)
            counts = self._counts(w, int(idx[-1]) + 1)
            if counts is not None:
                lo = int(idx[0])
                view = np.frombuffer(counts, np.int64)
                view[lo:int(idx[-1]) + 1] += np.bincount(idx - lo)

    def summary(self, min_windows: int) -> dict | None:
        if self.n < 2 or self.last <= self.first:
            return None
        gaps_n = self.n - 1
        mean = self.gap_sum / gaps_n
        var = max(0.0, self.gap_sq / gaps_n - mean * mean)
        out = {"duration_s": self.last - self.first, "rate_rps": gaps_n / (self.last - self.first),
               "cv": (var ** 0.5) / mean if mean > 0 else None}
        for w in self.windows:
            k = int((self.last - self.first) // w)
            counts = self.bins[w]
            if counts is None or k < min_windows:
                out[f"idc_{w:g}s"] = None
                continue
            c = np.frombuffer(counts, np.int64)[:k]
            if len(c) < k:
                c = np.concatenate([c, np.zeros(k - len(c), np.int64)])
            m = c.mean()
            out[f"idc_{w:g}s"] = float(c.var() / m) if m > 0 else None
        return out


class _Concurrency:
    """Time-weighted in-flight requests from (arrival, latency) in arrival order: a streaming sweep.

    Memory is the current number in flight plus a histogram over concurrency levels.
    """

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.level = 0
        self.t = None
        self.hist: dict[int, float] = {}
        self.with_latency = 0

    def _advance(self, to: float) -> None:
        if self.t is not None and to > self.t:
            self.hist[self.level] = self.hist.get(self.level, 0.0) + (to - self.t)
        self.t = to if self.t is None else max(self.t, to)

    def add(self, start: float, latency: float) -> None:
        self.with_latency += 1
        while self.ends and self.ends[0] <= start:  # ends before starts at equal times
            self._advance(heapq.heappop(self.ends))
            self.level -= 1
        self._advance(start)
        self.level += 1
        heapq.heappush(self.ends, start + latency)

    def summary(self, n_requests: int) -> dict | None:
        if self.with_latency < max(2, 0.5 * n_requests):
            return None
        while self.ends:
            self._advance(heapq.heappop(self.ends))
            self.level -= 1
        total = sum(self.hist.values())
        if total <= 0:
            return None
        mean = sum(level * d for level, d in self.hist.items()) / total
        acc = 0.0
        for level in sorted(self.hist):
            acc += self.hist[level] / total
            if acc >= 0.95:
                return {"mean": mean, "p95": float(level)}
        return {"mean": mean, "p95": float(max(self.hist))}


class WorkloadStats:
    """Statistics of requests added in arrival order, in bounded memory.

    Token lengths keep exact sums and maxima and a sample of up to ``max_samples`` requests chosen
    by a hash of each request's position (all of them until then), so two streams fed the same
    requests in the same order sample the same ones. ``windows``: the fixed windows (s) of the
    streaming index of dispersion of counts (fidelity's). ``top_prefixes``, ``dispersion_index``
    and ``dispersion_window_s`` are filled by ``workload_stats`` from the requests in memory.
    """

    def __init__(self, *, block_tokens: int, max_samples: int = 200_000,
                 windows: tuple[float, ...] = (1.0, 10.0, 60.0)) -> None:
        self.block_tokens = block_tokens
        self.n = 0
        self.prompt_sample = array("q")
        self.output_sample = array("q")
        self._keys = array("q")
        self.prompt_sum = self.output_sum = 0
        self.prompt_max = self.output_max = 0
        self.long_prompts = self.short_outputs = 0
        self.with_tools = self.structured = 0
        self.turns: dict[str, int] = {}  # conversation id -> turns seen
        self.level = 0
        self.max_samples = max_samples
        self.arrivals = Arrivals(windows)
        self.concurrency = _Concurrency()
        self.cache = PrefixCache()
        self.top_prefixes: list[SharedPrefix] = []
        self.dispersion_index: float | None = None  # variance/mean of arrivals per window (1 for Poisson)
        self.dispersion_window_s: float | None = None

    def _resample(self) -> None:
        while len(self._keys) > self.max_samples:
            self.level += 1
            keep = (mix64_np(np.frombuffer(self._keys, np.int64)) & np.uint64((1 << self.level) - 1)) == 0
            for name in ("_keys", "prompt_sample", "output_sample"):
                setattr(self, name, array("q", np.frombuffer(getattr(self, name), np.int64)[keep].tobytes()))

    def add(self, arrival_s: float, prompt_tokens: int, output_tokens: int, hashes: Iterable[int] = (),
            latency_s: float | None = None) -> None:
        key = self.n
        self.n += 1
        self.prompt_sum += prompt_tokens
        self.output_sum += output_tokens
        self.prompt_max = max(self.prompt_max, prompt_tokens)
        self.output_max = max(self.output_max, output_tokens)
        self.long_prompts += prompt_tokens >= LONG_PROMPT_TOKENS
        self.short_outputs += output_tokens <= SHORT_OUTPUT_TOKENS
        if self.level == 0 or mix64(key) & ((1 << self.level) - 1) == 0:
            self._keys.append(key)
            self.prompt_sample.append(prompt_tokens)
            self.output_sample.append(output_tokens)
            if len(self._keys) > self.max_samples:
                self._resample()
        self.arrivals.add_one(float(arrival_s))
        if latency_s is not None:
            self.concurrency.add(arrival_s, latency_s)
        self.cache.add(hashes)

    def add_request(self, r: Any) -> None:
        """One ``PoolRequest``: its numbers, and whether it uses tools, structured output, a conversation."""
        self.add(r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes or [])
        self.with_tools += bool(r.tools)
        self.structured += bool(r.response_format)
        if r.conversation_id:
            self.turns[r.conversation_id] = self.turns.get(r.conversation_id, 0) + 1

    def add_many(self, arrivals: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 hashes: np.ndarray | None = None, unique: np.ndarray | None = None) -> None:
        """Many requests' numbers at once; without ``hashes`` the prefix cache is left alone (it may be shared)."""
        n = len(arrivals)
        if not n:
            return
        keys = np.arange(self.n, self.n + n, dtype=np.int64)
        self.n += n
        p, o = np.asarray(prompt_tokens), np.asarray(output_tokens)
        self.prompt_sum += int(p.sum())
        self.output_sum += int(o.sum())
        self.prompt_max = max(self.prompt_max, int(p.max()))
        self.output_max = max(self.output_max, int(o.max()))
        self.long_prompts += int((p >= LONG_PROMPT_TOKENS).sum())
        self.short_outputs += int((o <= SHORT_OUTPUT_TOKENS).sum())
        keep = slice(None) if self.level == 0 else \
            (mix64_np(keys) & np.uint64((1 << self.level) - 1)) == 0
        self._keys.frombytes(keys[keep].tobytes())
        self.prompt_sample.frombytes(np.ascontiguousarray(p, np.int64)[keep].tobytes())
        self.output_sample.frombytes(np.ascontiguousarray(o, np.int64)[keep].tobytes())
        if len(self._keys) > self.max_samples:
            self._resample()
        self.arrivals.add(np.asarray(arrivals, np.float64))
        if hashes is not None:
            self.cache.add_flat(hashes, unique)

    def __len__(self) -> int:
        return self.n

    @property
    def n_requests(self) -> int:
        return self.n

    @property
    def prefix_hit_rate(self) -> float:
        return hit_rate(self.cache.hits, self.block_tokens, self.prompt_sum)

    def _dist(self, sample: array, total: int, top: int) -> dict[str, float]:
        x = np.frombuffer(sample, np.int64) if len(sample) else np.zeros(0)
        if not x.size:
            return {"mean": 0.0, **{f"p{q}": 0.0 for q in _Q}, "max": 0.0}
        return {"mean": total / self.n, **{f"p{q}": float(np.percentile(x, q)) for q in _Q}, "max": float(top)}

    @property
    def prompt_tokens(self) -> dict[str, float]:
        """mean (exact), p50, p90, p99 (of the sample), max (exact)."""
        return self._dist(self.prompt_sample, self.prompt_sum, self.prompt_max)

    @property
    def output_tokens(self) -> dict[str, float]:
        return self._dist(self.output_sample, self.output_sum, self.output_max)

    @property
    def duration_s(self) -> float:
        return self.arrivals.last - self.arrivals.first if self.n else 0.0

    @property
    def mean_rate_rps(self) -> float:
        return (self.n - 1) / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def interarrival_cv(self) -> float | None:
        a = self.arrivals.summary(min_windows=0)
        return a["cv"] if a else None

    def _share(self, count: int) -> float:
        return count / self.n if self.n else 0.0

    @property
    def share_long_prompts(self) -> float:  # prompt ≥ LONG_PROMPT_TOKENS
        return self._share(self.long_prompts)

    @property
    def share_short_outputs(self) -> float:  # output ≤ SHORT_OUTPUT_TOKENS
        return self._share(self.short_outputs)

    @property
    def prompt_output_ratio(self) -> float:
        """Total prompt tokens / total output tokens."""
        return self.prompt_sum / self.output_sum if self.output_sum > 0 else float("inf")

    @property
    def share_tools(self) -> float:
        return self._share(self.with_tools)

    @property
    def share_structured(self) -> float:
        return self._share(self.structured)

    @property
    def conversations(self) -> int:
        return len(self.turns)

    @property
    def turns_mean(self) -> float | None:
        return sum(self.turns.values()) / len(self.turns) if self.turns else None

    @property
    def turns_max(self) -> int | None:
        return max(self.turns.values()) if self.turns else None

    def to_dict(self) -> dict[str, Any]:
        """The statistics as plain values (the diagnostic report's ``workload`` details)."""
        out = {k: getattr(self, k) for k in _SUMMARY}
        out["top_prefixes"] = [asdict(sp) for sp in self.top_prefixes]
        return out


_SUMMARY = ("n_requests", "duration_s", "mean_rate_rps", "prompt_tokens", "output_tokens", "share_long_prompts",
            "share_short_outputs", "prompt_output_ratio", "prefix_hit_rate", "top_prefixes", "interarrival_cv",
            "dispersion_index", "dispersion_window_s", "share_tools", "share_structured", "conversations",
            "turns_mean", "turns_max")


def _arrival(r: Any) -> float:
    """PoolRequests are ordered by ``arrival_s``, ScheduledRequests by ``send_offset_s``."""
    return getattr(r, "arrival_s", None) or getattr(r, "send_offset_s", 0.0)


def shared_prefixes(requests: list[Any], top: int = 5) -> list[SharedPrefix]:
    """The prefixes whose reuse saves the most tokens, each request counted at its longest cached match."""
    seen: set[int] = set()
    saved_by: dict[tuple[int, int], list[int]] = {}
    for r in sorted(requests, key=_arrival):
        hashes = list(r.block_hashes or [])
        depth = 0
        for h in hashes:
            if h not in seen:
                break
            depth += 1
        if depth:
            entry = saved_by.setdefault((hashes[depth - 1], depth), [0, 0])
            entry[0] += 1
            entry[1] += depth * r.block_tokens
        seen.update(hashes)
    block = next((r.block_tokens for r in requests), 0)
    ranked = sorted(saved_by.items(), key=lambda kv: -kv[1][1])[:top]
    return [SharedPrefix(prefix_tokens=depth * block, requests=n, tokens_saved=s) for (_, depth), (n, s) in ranked]


def prefix_reuse(requests: list[Any], top: int = 5) -> tuple[float, list[SharedPrefix]]:
    """(prefix hit rate, the shared prefixes that save the most tokens) of PoolRequests or ScheduledRequests."""
    cache = PrefixCache()
    for r in sorted(requests, key=_arrival):
        cache.add(list(r.block_hashes or []))
    block = next((r.block_tokens for r in requests), 0)
    return hit_rate(cache.hits, block, sum(r.prompt_tokens for r in requests)), shared_prefixes(requests, top)


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
    reqs = sorted(requests, key=lambda r: r.arrival_s)
    if not reqs:
        raise ValueError("workload statistics need at least one request; the pool's serving split is empty")
    ws = WorkloadStats(block_tokens=reqs[0].block_tokens, max_samples=max(len(reqs), 1), windows=())
    for r in reqs:
        ws.add_request(r)
    ws.top_prefixes = shared_prefixes(reqs)
    _, ws.dispersion_index, ws.dispersion_window_s = burstiness(np.array([r.arrival_s for r in reqs], dtype=float))
    return ws
