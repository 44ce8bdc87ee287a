"""Test doubles for the harness: an Engine/Deployment pair with a known true capacity per config.

A fake deployment serves every request fast below its capacity and far over the SLA above it
(judging the step's nominal rate from RUNNER's step id, so Poisson sampling adds no noise), so RUNNER's real capacity search (``measure.find_capacity``) finds the capacity up to
its resolution. Each deployment's capacity is the config's true capacity times a seeded lognormal
factor (run-to-run noise). Faults are injected per config: crash, drift, client lag, warm-up errors.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

# CLI capacity flags for fast searches against fake deployments (fast answers, 1% resolution)
SMALL = ["--step-duration", "6", "--min-completed", "5", "--resolution", "0.01"]

from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.loadgen.records import RequestRecord, ScheduledRequest, StepOutcome
from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool


def make_pool(tmp: Path, n: int = 60):
    rows = [PoolRequest(id=f"q{i}", arrival_s=i * 0.5, conversation_id=f"c{i}", turn=0, api="chat",
                        messages=[{"role": "user", "content": f"question {i}"}], prompt=None, tools=None,
                        tool_choice=None, response_format=None, sampling={}, prompt_tokens=20, output_tokens=8,
                        block_hashes=[], block_tokens=64, split="serving") for i in range(n)]
    return read_pool(write_pool(rows, tmp / "pool", {"token_counter": "test"}))


@dataclass
class Faults:
    crash_deploy: bool = False
    crash_step: bool = False
    lag: bool = False
    warmup_errors: bool = False
    drift: dict[str, Any] = field(default_factory=dict)


class FakeDeployment:
    base_url = None

    def __init__(self, capacity: float, config: dict, faults: Faults, log: list):
        self.capacity, self.config, self.faults, self.log = capacity, config, faults, log
        self.closed = False

    def run_step(self, schedule: list[ScheduledRequest], *, step_id: str, timeout_s: float) -> StepOutcome:
        if self.faults.crash_step and not step_id.startswith("warmup"):
            raise RuntimeError("engine died (injected)")
        offs = [s.send_offset_s for s in schedule]
        span = max(offs) - min(offs) if len(offs) > 1 else 0.0
        rate = (len(offs) - 1) / span if span > 0 else 0.0
        named = re.search(r"-([0-9.]+)rps$", step_id)  # RUNNER names capacity steps by their nominal rate
        if named:
            rate = float(named.group(1))
        slow = rate > self.capacity
        lag = 0.5 if self.faults.lag else 0.0
        fail = self.faults.warmup_errors and step_id.startswith("warmup")
        recs = []
        for s in schedule:
            ttft = 5.0 if slow else 0.05
            e2e = ttft + 0.01 * (s.output_tokens - 1)
            sent = s.send_offset_s + lag
            recs.append(RequestRecord(
                request_id=s.request_id, step_id=step_id, scheduled_s=s.send_offset_s, sent_s=sent,
                first_token_s=None if fail else sent + ttft, end_s=sent + (0.01 if fail else e2e),
                ttft_s=None if fail else ttft, itl_s=[] if fail else [0.01] * (s.output_tokens - 1),
                e2e_s=None if fail else e2e, prompt_tokens=s.prompt_tokens,
                output_tokens=0 if fail else s.output_tokens, status="error" if fail else "ok",
                http_status=500 if fail else 200, error_class="http_5xx" if fail else None))
        reasons = [f"client schedule lag: send lag p99 {lag * 1e3:.0f} ms > 10 ms"] if lag else []
        return StepOutcome(step_id=step_id, records=recs, duration_s=max(offs or [0]) + 1.0,
                           client_invalid_reasons=reasons, meta={"send_lag_p99_ms": lag * 1e3})

    def flush_cache(self) -> bool:
        return True

    def server_info(self) -> dict[str, Any]:
        resolved = {"chunked_prefill_size": 8192, "schedule_policy": "fcfs", "kv_cache_dtype": "auto",
                    "max_running_requests": 256, **self.config, **self.faults.drift}
        return {**resolved, "version": "fake-1.0"}

    def metrics_text(self) -> str:
        return ""

    def start_profile(self, output_dir: str) -> None:
        pass

    def stop_profile(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    """``capacity_of(config)`` gives the true capacity; ``noise_cv`` the run-to-run spread."""
    name = "fake"
    restartable = True

    def __init__(self, capacity_of: Callable[[dict], float], *, noise_cv: float = 0.02,
                 faults_of: Callable[[dict], Faults] | None = None):
        self.capacity_of, self.noise_cv = capacity_of, noise_cv
        self.faults_of = faults_of or (lambda c: Faults())
        self.deployments: list[tuple[dict, int, FakeDeployment]] = []

    def deploy(self, config: dict[str, Any], *, seed: int = 0) -> FakeDeployment:
        faults = self.faults_of(config)
        if faults.crash_deploy:
            raise EngineError("server exited during start-up (injected)")
        sigma = math.sqrt(math.log1p(self.noise_cv ** 2))
        factor = float(np.exp(np.random.default_rng(seed).normal(-sigma * sigma / 2, sigma))) if sigma else 1.0
        dep = FakeDeployment(self.capacity_of(config) * factor, dict(config), faults, [])
        self.deployments.append((dict(config), seed, dep))
        return dep

    def version(self) -> str:
        return "fake-1.0"
