"""Owns the emulator's engine core: an SGLang-like scheduler loop over a roofline cost model.

Time-agnostic: callers (the virtual-time driver in ``sim.py``, the real-time HTTP server) add
requests and ask for the next step at a time ``now``; the core decides what SGLang's scheduler
would run (prefill batch, mixed chunk or decode round), prices it with ``cost.CostModel``,
applies its effects and returns a ``Step`` whose token events fire at ``start_s + duration_s``.

Modelled after SGLang 0.5.23's scheduler (``managers/scheduler.py``, ``schedule_policy.py``):
- waiting queue in ``fcfs`` or ``lpm`` order (lpm: longest cached prefix first, requests whose
  uncached prefix repeats one already admitted in the batch are deferred; falls back to fcfs when
  the queue is longer than 128 or the radix cache is off);
- admission by ``PrefillAdder`` budgets: chunk tokens, ``max_prefill_tokens``, free + evictable KV
  minus the running requests' reserve (remaining new tokens x new-token ratio), and
  ``max_running_requests``; one chunked request at a time continues first;
- prefill has priority over decode unless a ``prefill_decode_interval`` is armed (N decode rounds
  after every prefill/extend batch, while the running batch has >= min_bs requests);
- ``enable_mixed_chunk`` runs the running decodes inside the chunked-prefill step (one token each,
  also under speculative decoding, as SGLang's mixed steps degrade them to a plain decode), and those decode
  tokens come out of the step's budgets: ``PrefillAdder(mixed_with_decode_tokens=running_bs)`` takes them off
  the chunk, input and total tokens, so a chunk of 256 beside 200 decodes prefills 56 tokens (vLLM's
  ``max_num_batched_tokens`` is the same shared budget); with nothing left the step is a decode round;
- decode rounds retract requests (fewest generated tokens, longest prompt first) when KV runs out,
  and re-estimate the new-token ratio; the ratio decays from 0.7 x conservativeness to 14% of it
  over 600 decode steps;
- a radix prefix cache over block hashes (LRU eviction of unreferenced blocks, page-size
  granularity); cached tokens skip prefill compute;
- EAGLE-like speculative decoding: each verify step scores ``num_draft_tokens`` per request and
  accepts 1 + a truncated-geometric number of draft tokens;
- ``dp_size`` replicas behind a round-robin router, each its own scheduler and KV pool;
- a request reaches the scheduler ``Efficiency.request_in_s`` after the single frontend process has handled it
  (``frontend_req_s`` each, in arrival order: HTTP, tokenization; then ZMQ) and
  every token reaches the client ``request_out_s`` after its step (detokenizer, streaming): ``first_s``,
  ``finish_s`` and ``token_times`` are client-visible times; step timing (overlap scheduler, CUDA-graph
  padding, eager launches) is ``cost.CostModel``'s.
"""
from __future__ import annotations

import importlib.metadata

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from autoresearch_dagster.emulator.catalog import GPUSpec, ModelCard
from autoresearch_dagster.emulator.cost import (COST_MODEL_VERSION, CostModel, Efficiency, StepCost,
                                               cost_model_fingerprint, cuda_graph_batch_sizes)
from autoresearch_dagster.emulator.noise import NoiseSettings, NoiseSource
from autoresearch_dagster.emulator.resolve import Resolved, resolve_config
from autoresearch_dagster.emulator.spec_acceptance import SpecAcceptance, drafter_acceptance
from autoresearch_dagster.spec import KNOBS


def emulator_version() -> str:
    """The emulator's release as an engine reports one: the package version plus its cost model
    (``COST_MODEL_VERSION`` and ``cost_model_fingerprint``), since a new cost model serves the same config at other
    speeds, as a new engine release does. What keys on engine versions then treats it as one: the memory's
    tried-config conditions, the calibrations a campaign starts from, the engine_version sensor's re-diagnosis."""
    try:
        v = importlib.metadata.version("autoresearch-dagster")
    except importlib.metadata.PackageNotFoundError:
        from autoresearch_dagster import __version__ as v
    return f"emulator-{v}+cm{COST_MODEL_VERSION}.{cost_model_fingerprint()[:6]}"


def endpoint_version(endpoint: Any) -> str:
    """The version an emulated endpoint reports: the emulator's, plus ``+release`` when the spec sets
    ``engine_options.release`` (an emulated engine upgrade)."""
    release = (getattr(endpoint, "engine_options", None) or {}).get("release")
    return f"{emulator_version()}+{release}" if release not in (None, "") else emulator_version()


LPM_MAX_QUEUE = 128  # schedule_policy.py WAITING_QUEUE_PREFIX_MATCH_MAX
LPM_MATCH_S = 4e-6  # scheduler CPU per waiting request prefix-matched by a cache-aware policy
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
GEN_WINDOW = 40  # decode steps per gen_throughput window (--decode-log-interval)


@dataclass
class EmuRequest:
    rid: str
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[int] = field(default_factory=list)
    block_tokens: int = 64
    arrival_s: float = 0.0


@dataclass
class TokenEvent:
    rid: str
    n_tokens: int
    finished: bool
    cached_tokens: int | None = None
    error: str | None = None


class Step:
    """One scheduler iteration; its token events fire at ``start_s + duration_s``.

    ``events`` is built on first access (the virtual-time driver never needs per-token objects).
    """
    __slots__ = ("start_s", "duration_s", "kind", "kernels", "replica", "cost", "_events", "_build")

    def __init__(self, start_s: float, duration_s: float, kind: str, *, events: list[TokenEvent] | None = None,
                 kernels: list | None = None, replica: int = 0, cost: StepCost | None = None,
                 build: Callable[[], list[TokenEvent]] | None = None):
        self.start_s, self.duration_s, self.kind = start_s, duration_s, kind
        self.kernels = kernels if kernels is not None else []
        self.replica, self.cost = replica, cost
        self._events, self._build = events, build

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def events(self) -> list[TokenEvent]:
        if self._events is None:
            self._events = self._build() if self._build else []
            self._build = None
        return self._events

    def __repr__(self) -> str:
        return f"Step({self.kind}, start={self.start_s:.4f}, dur={self.duration_s * 1e3:.2f}ms, replica={self.replica})"


class _Req:
    """Scheduler-side request state. Token times are kept compactly: the first token's time, then
    segments of the replica's decode-step log (one token per step, or per-step counts under
    speculative decoding), plus single tokens produced by re-prefills after a retraction."""
    __slots__ = ("rid", "prompt", "out", "hashes", "bt", "arrival", "gen", "done", "total", "cached",
                 "n_locked", "first_s", "finish_s", "pieces", "seg_start", "status", "error", "replica",
                 "cached_reported", "retractions", "spec", "ready")

    def __init__(self, r: EmuRequest, replica: int):
        self.rid, self.prompt, self.out = r.rid, int(r.prompt_tokens), max(1, int(r.output_tokens))
        self.hashes, self.bt, self.arrival = r.block_hashes or [], max(1, int(r.block_tokens)), r.arrival_s
        self.gen = 0  # tokens generated (synced from the batch arrays when leaving the batch)
        self.done = 0  # tokens of the current prefill computed (or cached)
        self.total = self.prompt  # tokens to prefill (prompt + generated after a retraction)
        self.cached = 0  # prefix tokens served by the radix cache in the current prefill
        self.cached_reported: int | None = None
        self.n_locked = 0  # leading block hashes this request holds in the radix cache
        self.first_s: float | None = None
        self.finish_s: float | None = None
        self.pieces: list[tuple] = []  # ("seg", start_idx, end_idx) | ("tok", time)
        self.seg_start = -1
        self.status = "pending"
        self.error: str | None = None
        self.replica = replica
        self.retractions = 0
        self.spec: list[int] = []  # tokens per decode step under speculative decoding (1 in a mixed step)
        self.ready = r.arrival_s  # when the scheduler can see it (arrival + the frontend's fixed latency)


class RadixCache:
    """Prefix cache over chained block hashes: a hit on block i implies blocks 0..i are equal.

    Blocks referenced by running requests are locked; unreferenced ones sit in an LRU list and are
    evicted oldest first (a request touches its blocks deepest-first so parents outlive children).

    ``states``: the model has linear-attention layers (Qwen3-Next, Qwen3.5), whose recurrent state cannot be
    rebuilt from cached KV: a prefix is reusable only up to a point where a state was saved. SGLang's
    ``MambaRadixCache`` keeps a state at the end of each cached prompt, none where a later insert splits a node, so
    a conversation's next turn reuses its previous turn, while requests that share only a system prompt branch
    at a point without a state and reuse nothing. Here a prompt's last full block is such a checkpoint.
    """

    def __init__(self, states: bool = False):
        self.ref: dict[int, int] = {}
        self.tokens: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.size = 0  # tokens held (locked + evictable)
        self.evictable = 0
        self.states: set[int] | None = set() if states else None  # blocks a saved recurrent state ends at

    def match(self, hashes: list[int]) -> int:
        n = 0
        ref = self.ref
        for h in hashes:
            if h not in ref:
                break
            n += 1
        if self.states is not None:  # back off to the deepest matched block with a saved state
            while n and hashes[n - 1] not in self.states:
                n -= 1
        return n

    def save_state(self, h: int) -> None:
        """A request's prompt ends at block ``h`` (cached): its recurrent state is kept there (hybrid models)."""
        if self.states is not None and h in self.ref:
            self.states.add(h)

    def lock(self, hashes: list[int], bt: int) -> None:
        ref, lru = self.ref, self.lru
        for h in reversed(hashes):
            c = ref.get(h)
            if c is None:
                ref[h] = 1
                self.tokens[h] = bt
                self.size += bt
            else:
                if c == 0:
                    del lru[h]
                    self.evictable -= self.tokens[h]
                ref[h] = c + 1

    def unlock(self, hashes: list[int]) -> None:
        ref, lru = self.ref, self.lru
        for h in reversed(hashes):
            c = ref[h] - 1
            ref[h] = c
            if c == 0:
                lru[h] = None
                self.evictable += self.tokens[h]

    def evict(self, n_tokens: int) -> int:
        freed = 0
        lru = self.lru
        while freed < n_tokens and lru:
            h, _ = lru.popitem(last=False)
            t = self.tokens.pop(h)
            del self.ref[h]
            if self.states is not None:
                self.states.discard(h)
            freed += t
        self.size -= freed
        self.evictable -= freed
        return freed

    def flush_unlocked(self) -> None:
        self.evict(self.evictable)


class _Replica:
    """One data-parallel replica: its own waiting queue, running batch, KV pool and radix cache."""

    def __init__(self, idx: int, core: "EngineCore", seed: int):
        k = core.knobs
        self.idx, self.core = idx, core
        self.cap = core.resolved.max_total_num_tokens
        self.mrr = k["max_running_requests"]
        self.cps = k["chunked_prefill_size"] if k["chunked_prefill_size"] > 0 else None
        self.max_prefill = k["max_prefill_tokens"]
        self.page = k["page_size"]
        self.interval = k["prefill_decode_interval"]
        self.interval_min_bs = k["prefill_decode_interval_min_bs"]
        self.mixed = bool(k["enable_mixed_chunk"]) and self.cps is not None
        self.cache = None if k["disable_radix_cache"] else RadixCache(states=core.model.linear_layers > 0)
        self.lpm = k["schedule_policy"] == "lpm" and self.cache is not None
        self.graph_bs = core.cost.graph_bs
        self.spec_steps = k["speculative_num_steps"] or 0
        self.spec_topk = k["speculative_eagle_topk"] or 1
        self.spec_width = k["speculative_num_draft_tokens"] or 1
        self.spec_alpha = core.resolved.spec_alpha
        if self.spec_alpha and self.spec_topk > 1:  # a wider tree raises the chance one branch matches
            self.spec_alpha = 1 - (1 - self.spec_alpha) / math.sqrt(self.spec_topk)
        # per-position acceptance: the measured distribution when given (it already reflects the drafter
        # and tree it was measured with), else the algorithm's constant rate at every position
        self.spec_rates = np.full(self.spec_steps, self.spec_alpha)
        if self.spec_alpha and core.acceptance is not None:
            self.spec_rates = np.asarray(core.acceptance.rates(self.spec_steps), dtype=float)
            self.spec_alpha = float(self.spec_rates.mean()) or 1e-9  # stays truthy: speculative decoding is on
        self.spec_draft_steps = self.spec_steps if KNOBS["speculative_algorithm"].meaning(
            k["speculative_algorithm"]).draft_model else 0
        self.rng = np.random.default_rng(seed)
        self.noise = NoiseSource(core.noise_settings, seed)
        init = min(0.7 * k["schedule_conservativeness"], 1.0)
        self.ratio_init, self.ratio_min = init, init * 0.14
        self.ratio = init
        self.ratio_decay = (init - self.ratio_min) / RATIO_DECAY_STEPS
        self.waiting: deque[_Req] = deque()
        self.chunked: _Req | None = None
        # The running batch: slot arrays (views of growable buffers). gen/ctx/priv are stored minus
        # ``off``, which every plain decode step bumps instead of touching the arrays.
        self.reqs: list[_Req] = []
        self._buf = np.zeros((4, 64), dtype=np.int64)  # rows: gen, out, ctx, priv (KV owned outside the cache)
        self.off = 0
        self.next_finish = math.inf  # value of ``off`` at which the first running request finishes
        self._views()
        self.sum_ctx = 0
        self.private = 0  # KV tokens held by running/chunked requests outside the cache
        self.reserve_remaining = 0  # sum of min(out - gen, CLIP) over the running batch
        self.busy_until = 0.0
        self.t_now = 0.0  # start of the step being built
        self.interval_remaining = 0
        self.sched_cpu_s = 0.0  # extra scheduler CPU accrued for the next step (lpm prefix matching)
        self.dec_times: list[float] = []
        self.gen_hist: deque[tuple[float, int]] = deque(maxlen=GEN_WINDOW + 1)
        self.last_hit_rate = 0.0
        self.last_accept = 0.0
        self.last_decode_bs = 0
        self.c = {"prompt_tokens_total": 0, "cached_tokens_total": 0, "generation_tokens_total": 0,
                  "num_requests_total": 0, "num_retracted_requests_total": 0, "num_aborted_requests_total": 0,
                  "cuda_graph_passes_total": 0, "eager_passes_total": 0, "spec_verify_calls_total": 0,
                  "spec_accepted_tokens_total": 0, "spec_slots_total": 0, "prefill_steps_total": 0, "decode_steps_total": 0,
                  "mixed_steps_total": 0, "busy_s_total": 0.0}

    # ------------------------------------------------------------------ memory
    @property
    def used(self) -> int:
        return self.private + (self.cache.size if self.cache else 0)

    def available(self) -> int:
        """Tokens allocatable now, counting evictable cache."""
        ev = self.cache.evictable if self.cache else 0
        return self.cap - self.used + ev

    def _alloc(self, n: int) -> bool:
        free = self.cap - self.used
        if free < n and self.cache is not None:
            self.cache.evict(n - free)
            free = self.cap - self.used
        if free < n:
            return False
        self.private += n
        return True

    @property
    def n_running(self) -> int:
        return len(self.reqs)

    @property
    def has_work(self) -> bool:
        return bool(self.reqs) or bool(self.waiting) or self.chunked is not None

    # ------------------------------------------------------------------ prefix cache
    def _match(self, r: _Req) -> tuple[int, int]:
        """(blocks matched, cached tokens usable) for a request about to prefill."""
        if self.cache is None or not r.hashes:
            return 0, 0
        n = self.cache.match(r.hashes)
        tokens = n * r.bt
        if self.page > 1:
            tokens -= tokens % self.page
        return n, min(tokens, r.total - 1)

    # ------------------------------------------------------------------ scheduling
    def _ordered_waiting(self) -> list[_Req] | deque[_Req]:
        if not self.lpm or len(self.waiting) > LPM_MAX_QUEUE or len(self.waiting) < 2:
            return self.waiting
        cache = self.cache
        scored = sorted(self.waiting, key=lambda r: -cache.match(r.hashes) * r.bt)
        return scored

    def _build_prefill(self) -> list[tuple[_Req, int, int]] | None:
        """Pick this iteration's prefill segments [(req, new_tokens, prior_tokens)], SGLang PrefillAdder-like."""
        if self.chunked is None and (not self.waiting or self.n_running >= self.mrr):
            return None
        rem_chunk = self.cps if self.cps is not None else math.inf
        rem_input = self.max_prefill
        rem_total = self.available() - self.ratio * self.reserve_remaining
        if self.mixed and self.n_running:  # the decodes riding in a mixed step take their tokens first
            rem_chunk -= self.n_running
            rem_input -= self.n_running
            rem_total -= self.n_running
            if rem_chunk <= 0:
                return None
        segs: list[tuple[_Req, int, int]] = []
        if self.chunked is not None:
            r = self.chunked
            n = int(min(r.total - r.done, rem_chunk))
            if not self._alloc(n):
                return None
            segs.append((r, n, r.done))
            rem_chunk -= n
            rem_input -= n
            rem_total -= n
            if r.done + n < r.total:
                return segs
        slots = self.mrr - self.n_running - (1 if self.chunked is not None else 0)
        if slots <= 0 or not self.waiting or rem_chunk <= 0:
            return segs or None
        order = self._ordered_waiting()
        lpm_active = order is not self.waiting
        if lpm_active:  # matching every waiting request against the radix tree costs scheduler time
            self.sched_cpu_s += LPM_MATCH_S * len(self.waiting)
        in_batch: set[int] = set()
        admitted: list[_Req] = []
        for r in order:
            if slots <= 0 or rem_chunk <= 0:
                break
            if r.ready > self.t_now:  # still in the frontend (FCFS: so is every later arrival)
                if lpm_active:
                    continue
                break
            nb, cached = self._match(r)
            if lpm_active and nb < len(r.hashes) and r.hashes[nb] in in_batch:
                continue  # in-batch prefix dedup: let the first copy populate the cache
            extend = r.total - cached
            reserve = min(r.out - r.gen, CLIP_MAX_NEW_TOKENS)
            if extend + reserve > rem_total and (segs or admitted or self.n_running):
                break
            if extend > self.available():
                break
            if extend > rem_input and (segs or admitted):
                break
            n = int(min(extend, rem_chunk))
            if n < extend and n < max(self.page, 1):
                break
            if self.cache is not None and nb:
                self.cache.lock(r.hashes[:nb], r.bt)
            if not self._alloc(n):
                if self.cache is not None and nb:
                    self.cache.unlock(r.hashes[:nb])
                break
            r.n_locked = nb
            r.cached = cached
            r.done = cached
            if r.cached_reported is None:
                r.cached_reported = cached
            if lpm_active:
                in_batch.update(r.hashes[nb:nb + 1])
            segs.append((r, n, cached))
            admitted.append(r)
            slots -= 1
            rem_chunk -= n
            rem_input -= n
            rem_total -= extend + reserve
            if n < extend:
                break  # this one becomes the chunked request
        if admitted:
            if lpm_active:
                gone = set(id(r) for r in admitted)
                self.waiting = deque(r for r in self.waiting if id(r) not in gone)
            else:
                for _ in admitted:
                    self.waiting.popleft()
        return segs or None

    def _views(self) -> None:
        n = len(self.reqs)
        self.gen, self.out, self.ctx, self.priv = (self._buf[0, :n], self._buf[1, :n], self._buf[2, :n],
                                                   self._buf[3, :n])

    def _join(self, r: _Req, now_idx: int, priv: int) -> None:
        n = len(self.reqs)
        if n == self._buf.shape[1]:
            self._buf = np.concatenate([self._buf, np.zeros_like(self._buf)], axis=1)
        ctx = r.total
        self._buf[:, n] = (r.gen - self.off, r.out, ctx - self.off, priv - self.off)
        self.reqs.append(r)
        self._views()
        self.next_finish = min(self.next_finish, r.out - r.gen + self.off)
        self.sum_ctx += ctx
        self.reserve_remaining += min(r.out - r.gen, CLIP_MAX_NEW_TOKENS)
        r.seg_start = now_idx
        r.status = "running"

    def _leave(self, mask: np.ndarray, now_idx: int, finish_time: float | None) -> list[_Req]:
        """Remove the batch slots in ``mask``; close their token segments; free their KV."""
        idx = np.flatnonzero(mask)
        left = [self.reqs[i] for i in idx]
        off = self.off
        gens = self.gen[idx] + off
        for r, g in zip(left, gens.tolist()):
            r.gen = g
            if now_idx > r.seg_start >= 0:
                r.pieces.append(("seg", r.seg_start, now_idx))
            r.seg_start = -1
            if self.cache is not None and r.n_locked:
                self.cache.unlock(r.hashes[:r.n_locked])
                r.n_locked = 0
        k = len(idx)
        self.private -= int(self.priv[idx].sum()) + off * k
        self.sum_ctx -= int(self.ctx[idx].sum()) + off * k
        self.reserve_remaining -= int(np.minimum(self.out[idx] - gens, CLIP_MAX_NEW_TOKENS).sum())
        # swap-remove, highest slot first, so the remaining slots stay contiguous
        reqs, buf = self.reqs, self._buf  # event builders hold their own copy of the batch list
        for i in idx[::-1].tolist():
            last = len(reqs) - 1
            if i != last:
                reqs[i] = reqs[last]
                buf[:, i] = buf[:, last]
            reqs.pop()
        self._views()
        self.next_finish = int((self.out - self.gen).min()) if reqs else math.inf
        return left

    def _finish(self, r: _Req, t: float) -> None:
        r.finish_s = t + self.core.request_out_s
        r.status = "ok"
        self.core._finished.append(r)

    def _complete_prefill(self, r: _Req, t: float, dec_idx: int) -> bool:
        """A request's prefill is done: cache its prompt blocks, emit a token. True if it joins the batch."""
        if self.cache is not None and r.hashes:
            full = min(len(r.hashes), r.prompt // r.bt)
            new = r.hashes[r.n_locked:full]
            if new:
                self.cache.lock(new, r.bt)
                self.private -= len(new) * r.bt  # the KV of those tokens now belongs to the cache
                r.n_locked = full
            if full:
                self.cache.save_state(r.hashes[full - 1])
        held = r.total - r.n_locked * r.bt  # KV this request still owns outside the cache
        r.gen += 1
        r.total = r.prompt + r.gen
        if r.first_s is None:
            r.first_s = t + self.core.request_out_s
        else:
            r.pieces.append(("tok", t + self.core.request_out_s))
        self.c["generation_tokens_total"] += 1
        if r.gen >= r.out:
            self.private -= held
            if self.cache is not None and r.n_locked:
                self.cache.unlock(r.hashes[:r.n_locked])
                r.n_locked = 0
            self._finish(r, t)
            return False
        self.private += 1  # KV slot of the token just sampled
        self._join(r, dec_idx, held + 1)
        return True

    def _retract_for(self, need: int, now_idx: int) -> None:
        """Retract running requests until ``need`` KV tokens are allocatable (keep at least one)."""
        retracted = 0
        width = need // max(1, self.n_running)
        while self.available() < self.n_running * width and self.n_running > 1:
            # SGLang retraction_policy=length: fewest generated tokens first, then the longest prompt
            order = np.lexsort((-(self.ctx - self.gen), self.gen))  # offsets cancel / preserve order
            victim = int(order[0])
            mask = np.zeros(self.n_running, dtype=bool)
            mask[victim] = True
            (r,) = self._leave(mask, now_idx, None)
            r.total = r.prompt + r.gen
            r.done = 0
            r.status = "waiting"
            r.retractions += 1
            self.waiting.append(r)
            retracted += 1
        if retracted:
            self.c["num_retracted_requests_total"] += retracted
            total_out = int(self.out.sum()) or 1
            gen_total = int(self.gen.sum()) + self.off * self.n_running
            self.ratio = min(1.0, (gen_total + RETRACT_DECODE_STEPS * self.n_running) / total_out)

    # ------------------------------------------------------------------ one iteration
    def advance(self, now: float, want_events: bool):
        """Run one iteration starting at max(now, busy_until). Returns (start, duration, kind, cost, events_builder) or None."""
        if not self.has_work:
            return None
        start = max(now, self.busy_until)
        self.t_now = start
        model = self.core.model
        W = model.attn_window  # a sliding window or DSA's top-k: those layers read at most W tokens
        segs = None
        if (self.interval_remaining > 0 and self.n_running > 0 and self.n_running >= self.interval_min_bs):
            self.interval_remaining -= 1
        else:
            segs = self._build_prefill()
        dec_idx = len(self.dec_times)
        cm = self.core.cost
        if segs:
            mixed = self.mixed and self.n_running > 0
            p_tok = p_work = p_work_swa = p_read = p_read_swa = 0.0
            for r, n, prior in segs:
                p_tok += n
                mid = prior + n / 2.0
                p_work += n * mid
                p_read += prior
                if W:
                    p_work_swa += n * min(mid, W)
                    p_read_swa += min(prior, W)
            n_dec = self.n_running if mixed else 0
            dctx = self.sum_ctx if mixed else 0
            dctx_swa = self._ctx_clipped(W) if (mixed and W) else dctx
            cost = cm.step(prefill_tokens=int(p_tok), prefill_seqs=len(segs), prefill_attn_work=p_work,
                           prefill_attn_work_swa=p_work_swa if W else p_work, prefill_ctx_read=p_read,
                           prefill_ctx_read_swa=p_read_swa if W else p_read, decode_reqs=n_dec,
                           decode_ctx=dctx, decode_ctx_swa=dctx_swa, n_running=self.n_running + len(segs))
            if self.spec_draft_steps:
                cost.draft_s += (cost.gemm_s + cost.moe_s) * model.draft_fraction * 2
            cost.cpu_s += self.sched_cpu_s
            self.sched_cpu_s = 0.0
            dur = cost.total_s * self.noise.factor(start)
            end = start + dur
            kind = "mixed" if mixed else "prefill"
            self.c["mixed_steps_total" if mixed else "prefill_steps_total"] += 1
            if self.interval > 0:
                self.interval_remaining = self.interval
            cached_sum = 0
            prompt_sum = 0
            for r, n, prior in segs:
                if r.done == r.cached and r.cached_reported == r.cached and r.retractions == 0:
                    prompt_sum += r.prompt
                    cached_sum += r.cached
            if prompt_sum:
                self.last_hit_rate = cached_sum / prompt_sum
                self.c["prompt_tokens_total"] += prompt_sum
                self.c["cached_tokens_total"] += cached_sum
            joined_events: list[tuple[_Req, int, bool]] = []
            if mixed:
                batch_reqs = list(self.reqs) if want_events else None
                self._decode_effect(1, end, dec_idx)
                if want_events:
                    joined_events.extend((r, 1, False) for r in batch_reqs)
                dec_idx += 1
            self.chunked = None
            for r, n, prior in segs:
                r.done += n
                if r.done >= r.total:
                    joined = self._complete_prefill(r, end, dec_idx)
                    if want_events:
                        joined_events.append((r, 1, not joined))
                else:
                    self.chunked = r
                    r.status = "prefilling"
            if mixed:
                finished_now = self._reap(end, dec_idx)
                if want_events and finished_now:
                    fin = set(id(r) for r in finished_now)
                    joined_events = [(r, n, f or id(r) in fin) for r, n, f in joined_events]
        elif self.n_running:
            width = self.spec_width if self.spec_alpha else 1
            need = self.n_running * width
            if self.available() < need:
                self._retract_for(need, dec_idx)
            n = self.n_running
            dctx = self.sum_ctx
            dctx_swa = self._ctx_clipped(W) if W else dctx
            cost = cm.step(decode_reqs=n, decode_width=width, decode_ctx=dctx, decode_ctx_swa=dctx_swa,
                           draft_steps=self.spec_draft_steps if self.spec_alpha else 0,
                           draft_width=self.spec_topk, n_running=n)
            cost.cpu_s += self.sched_cpu_s
            self.sched_cpu_s = 0.0
            dur = cost.total_s * self.noise.factor(start)
            end = start + dur
            kind = "decode"
            self.c["decode_steps_total"] += 1
            self.c["cuda_graph_passes_total" if n <= self.graph_bs else "eager_passes_total"] += 1
            self.last_decode_bs = n
            self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
            batch_reqs = list(self.reqs) if want_events else None
            if self.spec_alpha:
                acc = self._spec_accept(n)
                self.c["spec_verify_calls_total"] += 1
                self.c["spec_accepted_tokens_total"] += int(acc.sum())
                self.c["spec_slots_total"] += n
                self.last_accept = float(acc.mean())
                self._decode_effect(acc, end, dec_idx)
            else:
                acc = None
                self._decode_effect(1, end, dec_idx)
            finished_now = self._reap(end, dec_idx + 1)
            joined_events = []
            if want_events:
                fin = set(id(r) for r in finished_now)
                counts = acc.tolist() if acc is not None else [1] * len(batch_reqs)
                joined_events = [(r, c, id(r) in fin) for r, c in zip(batch_reqs, counts)]
        elif self.chunked is None and (ready := min(r.ready for r in self.waiting)) > start:
            # nothing runs and nothing waiting has reached the scheduler yet
            self.busy_until = ready
            return start, ready - start, "idle", StepCost(), None
        elif self.chunked is None and self.waiting:
            # nothing runs and the head of the queue cannot fit in the KV pool even when empty
            r = self.waiting.popleft()
            r.status, r.error = "error", "request does not fit in the KV cache"
            self.core._finished.append(r)
            build = (lambda: [TokenEvent(r.rid, 0, True, None, r.error)]) if want_events else None
            return start, 0.0, "reject", StepCost(), build
        else:
            self.busy_until = start + 0.001
            return start, 0.001, "idle", StepCost(cpu_s=0.001), None
        self.busy_until = end
        self.c["busy_s_total"] += dur
        build = None
        if want_events:
            build = _events_builder(joined_events)
        return start, dur, kind, cost, build

    def _ctx_clipped(self, w: int) -> int:
        """sum(min(ctx, w)) over the batch (sliding-window layers read at most ``w`` tokens)."""
        return int(np.minimum(self.ctx, w - self.off).sum()) + self.off * len(self.reqs)

    def _spec_accept(self, n: int) -> np.ndarray:
        draws = self.rng.random((n, self.spec_steps)) < self.spec_rates
        acc = 1 + np.cumprod(draws, axis=1).sum(axis=1)
        return np.minimum(acc, self.out - self.gen - self.off)

    def _decode_effect(self, acc, end: float, dec_idx: int) -> None:
        if isinstance(acc, int):
            self.off += acc
            tot = acc * len(self.reqs)
            self.reserve_remaining -= tot
            if self.spec_alpha:  # a mixed step: token_times needs every decode step's count
                for r in self.reqs:
                    r.spec.append(acc)
        else:
            self._buf[[0, 2, 3], :len(self.reqs)] += acc
            tot = int(acc.sum())
            self.reserve_remaining -= tot
            self.next_finish = int((self.out - self.gen).min()) if self.reqs else math.inf
            for r, a in zip(self.reqs, acc.tolist()):
                r.spec.append(a)
        self.private += tot
        self.sum_ctx += tot
        self.c["generation_tokens_total"] += tot
        self.dec_times.append(end)
        self.gen_hist.append((end, self.c["generation_tokens_total"]))

    def _reap(self, end: float, now_idx: int) -> list[_Req]:
        if self.off < self.next_finish or not self.reqs:
            return []
        mask = self.gen + self.off >= self.out
        left = self._leave(mask, now_idx, end)
        for r in left:
            self._finish(r, end)
        return left

    def abort(self, rid: str) -> bool:
        for i, r in enumerate(self.reqs):
            if r.rid == rid:
                mask = np.zeros(self.n_running, dtype=bool)
                mask[i] = True
                self._leave(mask, len(self.dec_times), None)
                self._mark_aborted(r)
                return True
        if self.chunked is not None and self.chunked.rid == rid:
            r = self.chunked
            self.private -= r.done - r.cached
            if self.cache is not None and r.n_locked:
                self.cache.unlock(r.hashes[:r.n_locked])
                r.n_locked = 0
            self.chunked = None
            self._mark_aborted(r)
            return True
        for r in self.waiting:
            if r.rid == rid:
                self.waiting.remove(r)
                self._mark_aborted(r)
                return True
        return False

    def _mark_aborted(self, r: _Req) -> None:
        r.status = "error"
        r.error = "aborted"
        self.c["num_aborted_requests_total"] += 1
        self.core._finished.append(r)


def _events_builder(items: list[tuple[_Req, int, bool]]) -> Callable[[], list[TokenEvent]]:
    def build() -> list[TokenEvent]:
        return [TokenEvent(r.rid, int(n), bool(f), r.cached_reported) for r, n, f in items]
    return build


class EngineCore:
    """The emulated SGLang server's engine (one or ``dp_size`` replicas behind a round-robin router)."""

    def __init__(self, model: ModelCard, hw: GPUSpec, gpus: int, config: dict, *, seed: int = 0,
                 noise: NoiseSettings | None = None, efficiency: Efficiency | None = None,
                 acceptance: SpecAcceptance | None = None):
        self.model, self.hw, self.gpus = model, hw, gpus
        self.config = dict(config or {})
        # measured speculative acceptance, replacing the per-algorithm rate: the drafter the config names
        # first (a candidate's adapted drafter), else the endpoint's (``engine_options.spec_acceptance``)
        self.acceptance = drafter_acceptance(self.config) or acceptance
        self.resolved: Resolved = resolve_config(model, hw, gpus, self.config)
        self.knobs = self.resolved.knobs
        self.noise_settings = noise if noise is not None else NoiseSettings()
        self.efficiency = efficiency or Efficiency()
        self.seed = seed
        spec = self.knobs["speculative_algorithm"] is not None
        graphs = () if self.knobs["disable_cuda_graph"] else cuda_graph_batch_sizes(
            self.knobs["cuda_graph_max_bs_decode"], speculative=spec)
        self.cost = CostModel(model, hw, tp=self.knobs["tp_size"], fp8_weights=self.resolved.fp8_weights,
                              kv_bytes=self.resolved.kv_bytes, eff=self.efficiency,
                              cuda_graph_max_bs=self.knobs["cuda_graph_max_bs_decode"],
                              stream_interval=self.knobs["stream_interval"], cuda_graph_bs=graphs,
                              overlap=not self.knobs["disable_overlap_schedule"])
        self.request_in_s = self.efficiency.request_in_s
        self.request_out_s = self.efficiency.request_out_s
        self.frontend_req_s = self.efficiency.frontend_req_s
        self._frontend_free = 0.0  # when the single frontend process finishes the requests it has taken
        ss = np.random.SeedSequence(seed)
        self.replicas = [_Replica(i, self, int(s.generate_state(1)[0])) for i, s in enumerate(ss.spawn(self.knobs["dp_size"]))]
        self._rr = 0
        self._by_rid: dict[str, _Req] = {}
        self._finished: list[_Req] = []
        self._profiling = False
        self._profile_steps: list[Step] = []

    # ------------------------------------------------------------------ requests
    def add_request(self, req: EmuRequest, now: float) -> None:
        rep = self.replicas[self._rr]
        self._rr = (self._rr + 1) % len(self.replicas)
        r = _Req(req, rep.idx)
        r.status = "waiting"
        # one frontend process handles requests in turn (HTTP, chat template, tokenization), then ZMQ to the scheduler
        handled = now
        if self.frontend_req_s > 0:
            handled = self._frontend_free = max(now, self._frontend_free) + self.frontend_req_s
        r.ready = handled + self.request_in_s
        self._by_rid[r.rid] = r
        rep.c["num_requests_total"] += 1
        if not rep.has_work:
            rep.busy_until = max(rep.busy_until, r.ready)
        rep.waiting.append(r)

    def abort(self, rid: str) -> None:
        r = self._by_rid.get(rid)
        if r is not None and r.status in ("waiting", "running", "prefilling", "pending"):
            self.replicas[r.replica].abort(rid)

    # ------------------------------------------------------------------ stepping
    def next_free_s(self) -> float | None:
        """Earliest time a replica with work can start its next step (None when all are idle)."""
        times = [rep.busy_until for rep in self.replicas if rep.has_work]
        return min(times) if times else None

    def next_step(self, now: float) -> Step | None:
        """The next iteration of the replica that can start first (at max(now, its busy_until)).

        With dp_size > 1 a step may start after ``now`` (that replica is still busy); call again
        right away for the other replicas. None when nothing is waiting or running."""
        best = None
        for rep in self.replicas:
            if rep.has_work and (best is None or rep.busy_until < best.busy_until):
                best = rep
        if best is None:
            return None
        res = best.advance(now, want_events=True)
        if res is None:
            return None
        start, dur, kind, cost, build = res
        step = Step(start, dur, kind, replica=best.idx, cost=cost, build=build)
        if self._profiling:
            from autoresearch_dagster.emulator.profile import step_kernels
            step.kernels = step_kernels(step, self)
            self._profile_steps.append(step)
        return step

    def run_until(self, t: float) -> None:
        """Advance every replica through all steps that start before ``t`` (virtual-time fast path: no events)."""
        for rep in self.replicas:
            while rep.has_work and rep.busy_until < t:
                res = rep.advance(rep.busy_until, want_events=False)
                if res is None:
                    break
                if self._profiling:
                    start, dur, kind, cost, build = res
                    from autoresearch_dagster.emulator.profile import step_kernels
                    step = Step(start, dur, kind, replica=rep.idx, cost=cost, build=build)
                    step.kernels = step_kernels(step, self)
                    self._profile_steps.append(step)

    def drain(self, deadline: float = math.inf) -> None:
        """Run until every request finished (or ``deadline`` virtual seconds)."""
        for rep in self.replicas:
            while rep.has_work and rep.busy_until < deadline:
                res = rep.advance(rep.busy_until, want_events=False)
                if res is None:
                    break

    def pop_finished(self) -> list[_Req]:
        """Requests finished (or aborted) since the last call; the core forgets them."""
        out, self._finished = self._finished, []
        for r in out:
            self._by_rid.pop(r.rid, None)
        return out

    # ------------------------------------------------------------------ admin
    def flush_cache(self) -> bool:
        if self.knobs["disable_radix_cache"]:
            return False
        for rep in self.replicas:
            rep.cache.flush_unlocked()
        return True

    def resolved_config(self) -> dict:
        return dict(self.knobs)

    def server_info(self) -> dict:
        """SGLang /server_info-like: resolved knobs + scheduler info + internal states."""
        r = self.resolved
        return {**self.resolved_config(),
                "model_path": self.model.name, "gpu": self.hw.name, "gpus": self.gpus,
                "max_total_num_tokens": r.max_total_num_tokens,
                "max_req_input_len": r.max_total_num_tokens - 1,
                "internal_states": [{
                    "effective_max_running_requests_per_dp": self.knobs["max_running_requests"],
                    "last_gen_throughput": self._gen_throughput(rep),
                    "memory_usage": {"weight": round(r.weight_gib, 2),
                                     "kvcache": round(r.max_total_num_tokens * self.model.kv_bytes_per_token(
                                         r.kv_bytes, self.knobs["tp_size"]) / 2 ** 30, 2),
                                     "token_capacity": r.max_total_num_tokens},
                    "avg_spec_accept_length": self._accept_len(rep),
                } for rep in self.replicas]}

    @staticmethod
    def _gen_throughput(rep: _Replica) -> float:
        h = rep.gen_hist
        if len(h) < 2 or h[-1][0] <= h[0][0]:
            return 0.0
        return (h[-1][1] - h[0][1]) / (h[-1][0] - h[0][0])

    @staticmethod
    def _accept_len(rep: _Replica) -> float:
        slots = rep.c["spec_slots_total"]
        return rep.c["spec_accepted_tokens_total"] / slots if slots else 0.0

    def metrics(self) -> dict[str, float]:
        """Current values under SGLang's Prometheus metric names (summed / averaged over replicas)."""
        reps = self.replicas
        cap = sum(r.cap for r in reps)
        used_nonevict = sum(r.used - (r.cache.evictable if r.cache else 0) for r in reps)
        m: dict[str, float] = {
            "sglang:num_queue_reqs": float(sum(len(r.waiting) + (1 if r.chunked else 0) for r in reps)),
            "sglang:num_running_reqs": float(sum(r.n_running for r in reps)),
            "sglang:token_usage": used_nonevict / cap if cap else 0.0,
            "sglang:num_used_tokens": float(used_nonevict),
            "sglang:kv_used_tokens": float(sum(r.used for r in reps)),
            "sglang:kv_available_tokens": float(sum(r.available() for r in reps)),
            "sglang:kv_evictable_tokens": float(sum(r.cache.evictable if r.cache else 0 for r in reps)),
            "sglang:max_total_num_tokens": float(cap),
            "sglang:cache_hit_rate": float(np.mean([r.last_hit_rate for r in reps])),
            "sglang:gen_throughput": float(sum(self._gen_throughput(r) for r in reps)),
            "sglang:new_token_ratio": float(np.mean([r.ratio for r in reps])),
            "sglang:decode_batch_size": float(sum(r.last_decode_bs for r in reps)),
            "sglang:spec_accept_length": float(np.mean([r.last_accept for r in reps])),
            "sglang:spec_accept_length_avg": float(np.mean([self._accept_len(r) for r in reps])),
            "sglang:page_size": float(self.knobs["page_size"]),
            "sglang:context_len": float(self.model.context_len),
            "sglang:weight_memory_usage_gb": float(self.resolved.weight_gib),
        }
        for key in reps[0].c:
            m[f"sglang:{key}"] = float(sum(r.c[key] for r in reps))
        if self.knobs["speculative_algorithm"]:
            m["sglang:spec_num_steps"] = float(self.knobs["speculative_num_steps"])
            m["sglang:spec_num_draft_tokens"] = float(self.knobs["speculative_num_draft_tokens"])
        return m

    # ------------------------------------------------------------------ profiling
    def start_profile(self) -> None:
        if self._profiling:
            from autoresearch_dagster.spec import SpecError
            raise SpecError("a profile is already running")
        self._profiling = True
        self._profile_steps = []

    def stop_profile(self) -> dict:
        from autoresearch_dagster.emulator.profile import build_trace
        self._profiling = False
        steps, self._profile_steps = self._profile_steps, []
        return build_trace(steps, self)

    # ------------------------------------------------------------------ token times (for drivers)
    def token_times(self, r: _Req) -> tuple[np.ndarray, np.ndarray]:
        """(times, token counts) of every output event of a finished request, first token included."""
        dec = self.replicas[r.replica].dec_times
        out = self.request_out_s  # decode steps are logged at engine time; the client sees them this much later
        times: list[float] = []
        if r.first_s is not None:
            times.append(r.first_s)
        for p in r.pieces:
            if p[0] == "tok":
                times.append(p[1])
            else:
                times.extend([x + out for x in dec[p[1]:p[2]]] if out else dec[p[1]:p[2]])
        t = np.asarray(times, dtype=np.float64)
        if not r.spec:
            return t, np.ones(len(t), dtype=np.int64)
        counts = np.ones(len(t), dtype=np.int64)
        # decode-step counts follow the first token and any re-prefill tokens in time order
        dec_mask = np.ones(len(t), dtype=bool)
        dec_mask[0] = False
        k = 1
        for p in r.pieces:
            if p[0] == "tok":
                dec_mask[k] = False
                k += 1
            else:
                k += p[2] - p[1]
        counts[dec_mask] = np.asarray(r.spec[:int(dec_mask.sum())], dtype=np.int64)
        return t, counts
