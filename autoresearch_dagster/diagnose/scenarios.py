"""Owns the diagnosis validation scenarios: emulator endpoints with a known dominant bottleneck.

Each scenario is an endpoint (model, GPU, SLA, server config) plus a synthetic replay pool built
to provoke one bottleneck. ``run_scenario`` diagnoses it with the same ``diagnose`` a real endpoint
gets; the scenario's ``truth`` is used only to grade the ranking afterwards, never by the scoring.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autoresearch_dagster.spec import EndpointSpec
from autoresearch_dagster.tokens import block_hashes, count_tokens, synth_text

BLOCK_TOKENS = 64


@dataclass(frozen=True)
class Mix:
    """One class of requests in a synthetic pool."""
    share: float
    prompt: int  # mean prompt tokens
    output: int  # mean output tokens
    shared_prefix: int = 0  # tokens of a prefix shared with other requests of this class
    n_prefixes: int = 1  # distinct shared prefixes the class draws from
    spread: float = 0.25  # relative spread (uniform ±) of prompt and output lengths


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: str  # the bottleneck the scenario was built around (grading only)
    description: str
    model: str
    gpu: str
    sla: str
    config: dict[str, Any]
    mixes: tuple[Mix, ...]
    rate_rps: float  # mean arrival rate of the pool's timeline
    n_requests: int
    arrival_cv: float = 1.0  # coefficient of variation of inter-arrival times (1 = Poisson)
    gpus: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def endpoint(self) -> EndpointSpec:
        return EndpointSpec(name=self.name.replace("_", "-"), model=self.model,
                            hardware={"gpu": self.gpu, "count": self.gpus}, sla=self.sla,
                            server_config=self.config, engine="emulator")


SCENARIOS: list[Scenario] = [
    Scenario("prefill_interference", "prefill_interference",
             "chat decoding under a tight TPOT SLA while unchunked long documents arrive",
             "llama-3.1-8b", "H100", "ttft_p99<=8000ms,tpot_p99<=30ms,errors<=1%",
             {"chunked_prefill_size": -1},
             (Mix(0.8, 400, 300), Mix(0.2, 14000, 24)), rate_rps=4.0, n_requests=500),
    Scenario("kv_capacity", "kv_capacity",
             "a 32B dense model filling one H100's small KV pool with long contexts",
             "qwen2.5-32b", "H100", "ttft_p99<=6000ms,tpot_p99<=100ms,errors<=1%",
             {},
             (Mix(1.0, 3500, 400),), rate_rps=1.0, n_requests=300),
    Scenario("cuda_graph_coverage", "cuda_graph_coverage",
             "large decode batches above a small CUDA-graph max batch size",
             "llama-3.1-8b", "H100", "ttft_p99<=3000ms,tpot_p99<=25ms,errors<=1%",
             {"cuda_graph_max_bs_decode": 16},
             (Mix(1.0, 200, 250),), rate_rps=20.0, n_requests=1500),
    Scenario("missed_prefix_reuse", "missed_prefix_reuse",
             "agent traffic sharing long system prompts, radix cache turned off",
             "llama-3.1-8b", "H100", "ttft_p99<=600ms,tpot_p99<=60ms,errors<=1%",
             {"disable_radix_cache": True},
             (Mix(1.0, 5000, 60, shared_prefix=4600, n_prefixes=4),), rate_rps=4.0, n_requests=600),
    Scenario("decode_bound_small_batch", "decode_bound_small_batch",
             "a 32B model under a tight per-token SLA: weight reads bound each decode step",
             "qwen2.5-32b", "H200", "ttft_p99<=3000ms,tpot_p99<=24ms,errors<=1%",
             {},
             (Mix(1.0, 300, 500),), rate_rps=1.0, n_requests=300),
    Scenario("admission_limit", "admission_limit",
             "a low max_running_requests cap with memory to spare",
             "llama-3.1-8b", "H100", "ttft_p99<=2000ms,tpot_p99<=60ms,errors<=1%",
             {"max_running_requests": 8},
             (Mix(1.0, 300, 300),), rate_rps=4.0, n_requests=600),
    Scenario("burst_queueing", "burst_queueing",
             "arrivals in bursts (inter-arrival CV 3) against a TTFT SLA",
             "llama-3.1-8b", "H100", "ttft_p99<=800ms,tpot_p99<=80ms,errors<=1%",
             {},
             (Mix(1.0, 1500, 120),), rate_rps=10.0, n_requests=1500, arrival_cv=3.0),
    Scenario("compute_bound_prefill", "compute_bound_prefill",
             "long unique documents, short answers: prefill FLOPs set TTFT",
             "qwen2.5-32b", "H200", "ttft_p99<=2500ms,e2e_p99<=8000ms,errors<=1%",
             {},
             (Mix(1.0, 7000, 16),), rate_rps=1.0, n_requests=300),
]


def scenario(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"unknown scenario {name!r}; scenarios: {', '.join(s.name for s in SCENARIOS)}")


def _arrivals(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    if cv <= 1.0:
        gaps = rng.exponential(1.0 / rate, n)
    else:
        shape = 1.0 / cv ** 2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    return np.cumsum(gaps) - gaps[0]


def synthetic_requests(s: Scenario, *, seed: int = 0) -> list[Any]:
    """The scenario's pool as PoolRequests (completions prompts: shared prefix text + unique text)."""
    from autoresearch_dagster.pool.schema import PoolRequest

    rng = np.random.default_rng(seed)
    pyrng = random.Random(seed)
    arrivals = _arrivals(s.n_requests, s.rate_rps, s.arrival_cv, rng)
    weights = np.array([m.share for m in s.mixes], dtype=float)
    classes = rng.choice(len(s.mixes), size=s.n_requests, p=weights / weights.sum())
    prefixes = {(ci, k): synth_text(m.shared_prefix, seed=1000 * ci + k)
                for ci, m in enumerate(s.mixes) for k in range(m.n_prefixes) if m.shared_prefix}
    out = []
    for i, (t, ci) in enumerate(zip(arrivals, classes)):
        m = s.mixes[ci]

        def jitter(v: int) -> int:
            return max(1, int(round(v * (1.0 + m.spread * (2 * pyrng.random() - 1)))))

        prompt_len = jitter(m.prompt)
        head = prefixes.get((ci, pyrng.randrange(m.n_prefixes)), "") if m.shared_prefix else ""
        text = head + synth_text(max(8, prompt_len - m.shared_prefix), seed=seed * 1_000_003 + i)
        out.append(PoolRequest(
            id=f"{s.name}-{i}", arrival_s=float(t), conversation_id=None, turn=None, api="completions",
            messages=None, prompt=text, tools=None, tool_choice=None, response_format=None,
            sampling={"temperature": 0.0}, prompt_tokens=count_tokens(text), output_tokens=jitter(m.output),
            block_hashes=block_hashes(text, BLOCK_TOKENS), block_tokens=BLOCK_TOKENS, split="serving",
            output_tokens_source="synthetic"))
    return out


def build_scenario_pool(s: Scenario, out_dir: Path, *, seed: int = 0) -> Any:
    from autoresearch_dagster.pool.schema import read_pool, write_pool

    path = write_pool(synthetic_requests(s, seed=seed), Path(out_dir) / "pool",
                      {"block_tokens": BLOCK_TOKENS, "source_format": "synthetic", "scenario": s.name})
    return read_pool(path)


@dataclass
class ScenarioResult:
    name: str
    truth: str
    rank: int | None  # 1-based rank of the true bottleneck
    top: list[tuple[str, float]]
    wall_s: float
    report: Any = None


def run_scenario(s: Scenario, out_dir: Path, *, measurement: str = "short", probes: bool = True,
                 profile: bool = True, seed: int = 0) -> ScenarioResult:
    """Diagnose one scenario on the virtual-time emulator and grade the ranking."""
    import time

    from autoresearch_dagster.diagnose.report import diagnose
    from autoresearch_dagster.engines.emulator import EmulatorEngine

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    pool = build_scenario_pool(s, out_dir, seed=seed)
    ep = s.endpoint()
    report = diagnose(ep, pool, engine=EmulatorEngine(ep), config=dict(s.config), out_dir=out_dir / "report",
                      measurement=measurement, probes=probes, profile=profile, seed=seed)
    names = [h.bottleneck for h in report.hypotheses]
    rank = names.index(s.truth) + 1 if s.truth in names else None
    return ScenarioResult(s.name, s.truth, rank, [(h.bottleneck, h.score) for h in report.hypotheses[:3]],
                          time.perf_counter() - t0, report)
