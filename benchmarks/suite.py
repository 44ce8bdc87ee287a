"""The benchmark suite of emulated endpoints: different models, GPUs, workloads and SLAs, each with hidden
efficiency factors of its own (``engine_options.hidden_factors_seed``: every documented default scaled by
a seeded draw within ±30%), so a proposer whose surrogate is the emulator with the documented factors
has a wrong model of it, as it would of a real GPU.

The demo endpoint (examples/endpoints/demo.yaml, its logs) is one of them; the others get synthetic
replay pools written by seeded generators of four traffic shapes: chat with shared system prompts,
code completion (long prompts, short outputs), agent sessions (long contexts that grow turn by turn,
heavy prefix reuse) and bursty mixed traffic.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from autoresearch_dagster.pool.schema import PoolRequest, write_pool
from autoresearch_dagster.spec import EndpointSpec, load_endpoint

ROOT = Path(__file__).resolve().parents[1]


def _req(i: int, t: float, prompt: int, output: int, blocks: list[int], conv: str, turn: int) -> PoolRequest:
    return PoolRequest(id=f"q{i}", arrival_s=t, conversation_id=conv, turn=turn, api="chat",
                       messages=[{"role": "user", "content": f"request {i}"}], prompt=None, tools=None,
                       tool_choice=None, response_format=None, sampling={}, prompt_tokens=prompt, output_tokens=output,
                       block_hashes=blocks, block_tokens=64, split="serving")


def chat(rng: random.Random, n: int) -> list[PoolRequest]:
    """A few long system prompts shared by many conversations, short user turns, medium answers."""
    systems = [(s, rng.randint(800, 2500)) for s in range(6)]
    out, t = [], 0.0
    for i in range(n):
        s, sys_len = rng.choice(systems)
        user = rng.randint(40, 600)
        blocks = [s * 100_000 + b for b in range(sys_len // 64)]
        t += rng.expovariate(1.0)
        out.append(_req(i, t, sys_len + user, rng.randint(80, 600), blocks, f"c{i}", 0))
    return out


def code(rng: random.Random, n: int) -> list[PoolRequest]:
    """Long file contexts, short completions; a shared repository preamble."""
    out, t = [], 0.0
    for i in range(n):
        ctx = int(rng.lognormvariate(8.2, 0.5))  # ~3.6k tokens median
        t += rng.expovariate(1.0)
        out.append(_req(i, t, min(ctx, 14000), rng.randint(20, 160), [900_000 + b for b in range(10)], f"c{i}", 0))
    return out


def agent(rng: random.Random, n: int) -> list[PoolRequest]:
    """Multi-turn sessions whose context grows every turn: each turn's prompt repeats the previous one."""
    out, t, i, s = [], 0.0, 0, 0
    while i < n:
        ctx, blocks = rng.randint(1500, 4000), []
        for turn in range(rng.randint(3, 8)):
            if i >= n:
                break
            ctx += rng.randint(200, 1500)
            blocks = blocks + [s * 10_000 + len(blocks) + b for b in range(ctx // 64 - len(blocks))]
            t += rng.expovariate(1.5)
            out.append(_req(i, t, ctx, rng.randint(100, 500), list(blocks), f"s{s}", turn))
            i += 1
        s += 1
    return sorted(out, key=lambda r: r.arrival_s)


def bursty(rng: random.Random, n: int) -> list[PoolRequest]:
    """Mixed lengths arriving in bursts (BurstGPT-like)."""
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(8.0) if rng.random() < 0.7 else rng.expovariate(0.3)
        out.append(_req(i, t, int(rng.lognormvariate(6.8, 0.9)), int(rng.lognormvariate(5.3, 0.7)), [], f"c{i}", 0))
    return out


SHAPES = {"chat": chat, "code": code, "agent": agent, "bursty": bursty}


@dataclass(frozen=True)
class Bench:
    name: str
    model: str
    gpu: str
    gpus: int
    sla: str
    shape: str  # a generator of SHAPES, or "demo" (the demo's own logs)
    hidden_seed: int
    server_config: tuple = ()  # the production config's knobs, as (name, value) pairs (a frozen dataclass)

    def endpoint(self) -> EndpointSpec:
        if self.shape == "demo":
            return load_endpoint(ROOT / "examples/endpoints/demo.yaml")
        return EndpointSpec(name=self.name, model=self.model, hardware={"gpu": self.gpu, "count": self.gpus},
                            sla=self.sla, server_config=dict(self.server_config),
                            engine_options={"hidden_factors_seed": self.hidden_seed})

    def pool(self, out: Path, n: int = 800) -> Path:
        """The endpoint's replay pool (built from the demo's logs, or generated, seeded)."""
        if self.shape == "demo":
            from autoresearch_dagster.pool.build import build_pool

            ep = self.endpoint()
            return Path(build_pool(ep.log_paths(), ep.name, out / self.name, key=b"bench-suite").pool_path)
        rows = SHAPES[self.shape](random.Random(f"{self.name}-{self.hidden_seed}"), n)
        return Path(write_pool(rows, out / self.name, {"token_counter": f"synthetic:{self.shape}"}))


SUITE = [
    Bench("demo", "gemma-moe-26b-a4b", "H200", 1, "", "demo", 7),
    Bench("llama8b-h100-chat", "llama-3.1-8b", "H100", 1, "ttft_p99<=2s,tpot_p99<=40ms,errors<=1%", "chat", 11),
    Bench("qwen32b-2xh100-code", "qwen2.5-32b", "H100", 2, "ttft_p99<=4s,tpot_p99<=60ms,errors<=1%", "code", 12),
    Bench("llama8b-l40s-bursty", "llama-3.1-8b", "L40S", 1, "ttft_p99<=3s,tpot_p99<=80ms,errors<=1%", "bursty", 13),
    Bench("gemma-a100-agent", "gemma-moe-26b-a4b", "A100", 1, "ttft_p99<=5s,tpot_p99<=60ms,errors<=1%", "agent", 14),
    Bench("qwen3moe-8xh200-agent", "qwen3-235b-a22b", "H200", 8, "ttft_p99<=8s,tpot_p99<=80ms,errors<=1%", "agent", 15,
          (("tp_size", 8),)),  # 438 GiB of weights: production runs it over all eight GPUs
    Bench("qwen32b-b200-chat", "qwen2.5-32b", "B200", 1, "ttft_p99<=2s,tpot_p99<=30ms,errors<=1%", "chat", 16),
]
