"""Test double of EngineCore with fixed, known step times (shared by the emulator HTTP tests)."""
from __future__ import annotations

from autoresearch_dagster.emulator.core import Step, TokenEvent


class ScriptedCore:
    """Test double with the EngineCore interface and fixed, known step times.

    Prefill steps take ``prefill_s`` and emit each waiting request's first token (with cached
    tokens = its leading blocks seen before); decode steps take ``decode_s`` and emit
    ``tokens_per_step`` tokens to every running request. A request reaches an idle core's scheduler
    ``request_in_s`` after it is added, and the driver delivers events ``request_out_s`` after their
    step (``EngineCore``'s fixed per-request latency). Used where exact timings are asserted.
    """

    def __init__(self, prefill_s=0.02, decode_s=0.01, tokens_per_step=1, radix=True, request_in_s=0.0,
                 request_out_s=0.0):
        self.prefill_s, self.decode_s, self.tokens_per_step = prefill_s, decode_s, tokens_per_step
        self.request_in_s, self.request_out_s = request_in_s, request_out_s
        self.radix = radix
        self.waiting, self.running = [], {}
        self.seen_blocks: set[int] = set()
        self.aborted: list[str] = []
        self.added: list = []
        self.flushes = 0
        self.profiling = False
        self.steps_profiled = 0
        self.now_calls: list[float] = []
        self.busy_until = 0.0

    def add_request(self, req, now):
        self.added.append((req, now))
        if not self.waiting and not self.running:
            self.busy_until = max(self.busy_until, now + self.request_in_s)
        self.waiting.append(req)

    def next_free_s(self):
        return self.busy_until if (self.waiting or self.running) else None

    def pop_finished(self):
        return []

    def next_step(self, now):
        self.now_calls.append(now)
        now = max(now, self.busy_until)
        step = self._step(now)
        if step is not None:
            self.busy_until = now + step.duration_s
        return step

    def _step(self, now):
        if self.waiting:
            batch, self.waiting = self.waiting, []
            events = []
            for r in batch:
                hit = 0
                for h in r.block_hashes:
                    if h not in self.seen_blocks:
                        break
                    hit += r.block_tokens
                self.seen_blocks.update(r.block_hashes)
                left = r.output_tokens - 1
                events.append(TokenEvent(r.rid, 1, left <= 0, cached_tokens=hit))
                if left > 0:
                    self.running[r.rid] = left
            if self.profiling:
                self.steps_profiled += 1
            return Step(now, self.prefill_s, "prefill", events=events)
        if self.running:
            events = []
            for rid, left in list(self.running.items()):
                n = min(self.tokens_per_step, left)
                left -= n
                events.append(TokenEvent(rid, n, left == 0))
                if left:
                    self.running[rid] = left
                else:
                    del self.running[rid]
            if self.profiling:
                self.steps_profiled += 1
            return Step(now, self.decode_s, "decode", events=events)
        return None

    def abort(self, rid):
        self.aborted.append(rid)
        self.running.pop(rid, None)
        self.waiting = [r for r in self.waiting if r.rid != rid]

    def flush_cache(self):
        if not self.radix:
            return False
        self.flushes += 1
        self.seen_blocks.clear()
        return True

    def metrics(self):
        return {"sglang:num_running_reqs": float(len(self.running)), "sglang:num_queue_reqs": float(len(self.waiting)),
                "sglang:token_usage": 0.1, "sglang:max_total_num_tokens": 100000.0}

    def resolved_config(self):
        return {"stream_interval": 1, "tp_size": 1, "max_running_requests": 256, "max_total_num_tokens": 100000,
                "chunked_prefill_size": 8192, "disable_radix_cache": not self.radix}

    def start_profile(self):
        self.profiling = True
        self.steps_profiled = 0

    def stop_profile(self):
        self.profiling = False
        return {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "fake_gemm", "ts": 0, "dur": 10, "pid": 0,
                                 "tid": 7}] * max(1, self.steps_profiled), "displayTimeUnit": "ms"}
