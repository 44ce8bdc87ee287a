"""Fixtures for the proposer tests: a small emulated endpoint whose knobs matter, and fast measurement."""
from __future__ import annotations

from pathlib import Path

from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool
from autoresearch_dagster.spec import EndpointSpec

# short steps: a surrogate point or a run takes a fraction of a second on the small pool
FAST = CapacitySettings(step_duration_s=20.0, min_completed=30, start_rps=1.0, resolution=0.1, warmup_s=0.0,
                        max_steps=10)


def small_endpoint(**kw) -> EndpointSpec:
    data = dict(name="small", model="llama-3.1-8b", hardware={"gpu": "H100", "count": 1},
                sla="ttft_p99<=8s,tpot_p99<=40ms,errors<=1%", server_config={})
    data.update(kw)
    return EndpointSpec(**data)


def long_prompt_pool(tmp: Path, n: int = 240, *, seed: int = 3):
    """Chat-like requests, a share of them with long prompts: prefill interference is real on it."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        long = rng.random() < 0.25
        rows.append(PoolRequest(id=f"q{i}", arrival_s=i * 0.4, conversation_id=f"c{i}", turn=0, api="chat",
                                messages=[{"role": "user", "content": f"question {i}"}], prompt=None, tools=None,
                                tool_choice=None, response_format=None, sampling={},
                                prompt_tokens=rng.randint(6000, 12000) if long else rng.randint(200, 1200),
                                output_tokens=rng.randint(100, 400), block_hashes=[], block_tokens=64,
                                split="serving"))
    return read_pool(write_pool(rows, tmp / "pool", {"token_counter": "test"}))
