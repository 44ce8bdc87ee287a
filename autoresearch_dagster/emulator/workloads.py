"""Owns synthetic workloads for the emulator's tests, benchmarks and calibration.

``MemoryPool`` is a replay pool held in memory (the ``ReplayPool`` surface the load generator
reads: ``iter_requests``, ``request``, ``__len__``, ``content_hash``, ``meta``), built from
length distributions and a prefix-sharing pattern, so a test can vary one thing at a time
(prompt length, output length, shared vs unique prefixes) without writing Parquet.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from autoresearch_dagster.pool.schema import PoolRequest


class MemoryPool:
    def __init__(self, requests: list[PoolRequest], meta: dict | None = None):
        if not requests:
            raise ValueError("a pool needs at least one request")
        self.requests = requests
        self.meta = dict(meta or {})
        self.path = None

    def __len__(self) -> int:
        return len(self.requests)

    def request(self, i: int) -> PoolRequest:
        return self.requests[i]

    def iter_requests(self, split: str | None = "serving") -> Iterator[PoolRequest]:
        return (r for r in self.requests if split is None or r.split == split)

    @property
    def content_hash(self) -> str:
        h = hashlib.sha256()
        for r in self.requests:
            h.update(f"{r.prompt_tokens},{r.output_tokens},{r.block_hashes[:4]}".encode())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class WorkloadShape:
    """Lengths are lognormal around the given medians (``sigma`` 0 = fixed), clipped to [min, max]."""
    n: int = 400
    prompt_median: int = 1000
    prompt_sigma: float = 0.5
    output_median: int = 200
    output_sigma: float = 0.5
    shared_prefix_tokens: int = 0  # a prefix drawn from ``n_prefixes`` shared ones, inside the prompt
    n_prefixes: int = 1
    block_tokens: int = 64
    prompt_min: int = 16
    prompt_max: int = 32000
    output_min: int = 2
    output_max: int = 4096


def _chain(parent: int, salt: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{parent}:{salt}".encode(), digest_size=8).digest(), "big") >> 1


def synthetic_pool(shape: WorkloadShape, *, seed: int = 0) -> MemoryPool:
    """A pool of ``shape.n`` requests; block hashes encode the shared-prefix structure."""
    rng = np.random.default_rng(seed)

    def draw(median: int, sigma: float, lo: int, hi: int) -> np.ndarray:
        v = median * np.exp(rng.normal(0, sigma, shape.n)) if sigma > 0 else np.full(shape.n, float(median))
        return np.clip(np.round(v), lo, hi).astype(int)

    prompts = draw(shape.prompt_median, shape.prompt_sigma, shape.prompt_min, shape.prompt_max)
    outputs = draw(shape.output_median, shape.output_sigma, shape.output_min, shape.output_max)
    bt = shape.block_tokens
    reqs: list[PoolRequest] = []
    for i in range(shape.n):
        p = int(prompts[i])
        hashes: list[int] = []
        shared = min(shape.shared_prefix_tokens, p) // bt
        prefix_id = int(rng.integers(shape.n_prefixes)) if shape.shared_prefix_tokens else -1
        h = _chain(0, f"prefix{prefix_id}" if shared else f"req{seed}-{i}")
        for b in range(p // bt):
            if b < shared:
                h = _chain(h, b)
            else:
                h = _chain(h, f"{seed}-{i}-{b}")
            hashes.append(h)
        reqs.append(PoolRequest(
            id=f"w{i}", arrival_s=float(i), conversation_id=None, turn=None, api="completions", messages=None,
            prompt="x", tools=None, tool_choice=None, response_format=None, sampling={}, prompt_tokens=p,
            output_tokens=int(outputs[i]), block_hashes=hashes, block_tokens=bt, split="serving"))
    return MemoryPool(reqs, {"token_counter": "synthetic", "block_tokens": bt, "shape": shape.__dict__})
