"""Owns adapting a replay pool to what an endpoint can serve, with every change recorded, never silent.

A real engine refuses what it was not started for: prompts over its max-model-len (HTTP 400, context
too long) and, without a tool parser, any request with tools and ``tool_choice: auto``. Replaying
such requests measures refusals, not the endpoint. ``AdaptedPool`` wraps a pool with ``PoolLimits``:

- ``max_model_len``: a request whose prompt (by the pool's token counter) leaves under ``margin`` of
  the window is dropped; one whose prompt fits but whose expected output would not has its output
  trimmed to fit;
- ``max_output_tokens``: a longer expected output is capped (an endpoint whose gateway limits
  ``max_tokens``; also how a slow engine's campaign keeps each load step's drain short);
- ``strip_tools``: tool definitions and ``tool_choice`` are removed (the messages are kept);
- ``strip_sampling``: these sampling parameters are removed, e.g. ``seed``: vLLM 0.32's CPU backend
  gives a seeded request its own CPU ``torch.Generator`` and, when it discards the token sampled for a
  partial (chunked) prefill, calls ``set_offset`` on it, which CPU generators do not support: the
  worker dies with ``RuntimeError: CPU Generator does not use offset`` and every later request fails.

``AdaptedPool.adaptation`` says what changed (counts, limits, the first dropped ids); it is in the
pool's ``meta["adaptation"]`` and its ``content_hash`` so results of an adapted replay never pass
for the original pool's. ``limits_from_options`` reads an endpoint's ``engine_options.adapt_pool``;
``write_adapted`` stores an adapted pool as a pool directory of its own (``autoresearch pool adapt``), so
every reader of a path (the surrogate's worker processes too) sees the same requests.
``adapt_body`` applies the stripping rules to one request body already scheduled: engines that serve
every measurement path (noise, experiments, campaigns) adapt each step this way and record the counts.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterator

from autoresearch_dagster.spec import EndpointSpec, SpecError


@dataclass(frozen=True)
class PoolLimits:
    max_model_len: int | None = None
    strip_tools: bool = False
    strip_sampling: tuple[str, ...] = ()
    margin: float = 0.02  # share of the window kept free: the pool's token count is not the engine's tokenizer
    max_output_tokens: int | None = None


def limits_from_options(endpoint: EndpointSpec) -> PoolLimits | None:
    """``engine_options.adapt_pool`` ({strip_tools, strip_sampling, max_model_len, margin}) as limits; None when absent.
    ``max_model_len`` defaults to the server config's."""
    opts = endpoint.engine_options.get("adapt_pool")
    if not opts:
        return None
    if not isinstance(opts, dict) or set(opts) - {"strip_tools", "strip_sampling", "max_model_len", "margin",
                                                  "max_output_tokens"}:
        raise SpecError("engine_options.adapt_pool takes strip_tools (bool), strip_sampling (list of sampling "
                        "parameter names), max_model_len (int), margin (0-0.5), max_output_tokens (int)")
    strip_sampling = opts.get("strip_sampling", [])
    if not isinstance(strip_sampling, list) or not all(isinstance(k, str) for k in strip_sampling):
        raise SpecError(f"engine_options.adapt_pool.strip_sampling must be a list of names, got {strip_sampling!r}")
    limit = opts.get("max_model_len", endpoint.server_config.get("max_model_len"))
    margin = float(opts.get("margin", PoolLimits.margin))
    if limit is not None and (not isinstance(limit, int) or limit < 16):
        raise SpecError(f"engine_options.adapt_pool.max_model_len must be an integer >= 16, got {limit!r}")
    if not 0 <= margin <= 0.5:
        raise SpecError(f"engine_options.adapt_pool.margin must be within [0, 0.5], got {margin!r}")
    cap = opts.get("max_output_tokens")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise SpecError(f"engine_options.adapt_pool.max_output_tokens must be an integer >= 1, got {cap!r}")
    return PoolLimits(max_model_len=limit, strip_tools=bool(opts.get("strip_tools", False)),
                      strip_sampling=tuple(strip_sampling), margin=margin, max_output_tokens=cap)


def adapt_request(req: Any, limits: PoolLimits) -> tuple[Any | None, list[str]]:
    """(the adapted request or None when dropped, what changed: 'dropped_over_context', 'trimmed_output',
    'capped_output', 'tools_stripped', 'sampling_stripped')."""
    changes: list[str] = []
    if limits.max_output_tokens is not None and req.output_tokens > limits.max_output_tokens:
        req = dataclasses.replace(req, output_tokens=limits.max_output_tokens)
        changes.append("capped_output")
    if limits.max_model_len is not None:
        window = int(limits.max_model_len * (1.0 - limits.margin))
        if req.prompt_tokens >= window:
            return None, ["dropped_over_context"]
        if req.prompt_tokens + req.output_tokens > window:
            req = dataclasses.replace(req, output_tokens=window - req.prompt_tokens)
            changes.append("trimmed_output")
    if limits.strip_tools and (req.tools or req.tool_choice is not None):
        req = dataclasses.replace(req, tools=None, tool_choice=None)
        changes.append("tools_stripped")
    if any(k in req.sampling for k in limits.strip_sampling):
        req = dataclasses.replace(req, sampling={k: v for k, v in req.sampling.items() if k not in limits.strip_sampling})
        changes.append("sampling_stripped")
    return req, changes


def adapt_body(body: dict[str, Any], limits: PoolLimits) -> tuple[dict[str, Any], list[str]]:
    """(the request body with ``strip_tools`` / ``strip_sampling`` applied, what changed)."""
    changes: list[str] = []
    out = body
    if limits.strip_tools and ("tools" in body or "tool_choice" in body):
        out = {k: v for k, v in out.items() if k not in ("tools", "tool_choice")}
        changes.append("tools_stripped")
    if any(k in body for k in limits.strip_sampling):
        out = {k: v for k, v in out.items() if k not in limits.strip_sampling}
        changes.append("sampling_stripped")
    return out, changes


class AdaptedPool:
    """A pool whose requests are adapted to ``limits``; the rest of the pool contract is the original's."""

    def __init__(self, pool: Any, limits: PoolLimits) -> None:
        self.original = pool
        self.limits = limits
        self._requests: list[Any] = []
        counts = {"dropped_over_context": 0, "trimmed_output": 0, "capped_output": 0, "tools_stripped": 0,
                  "sampling_stripped": 0}
        dropped: list[str] = []
        n = 0
        for req in pool.iter_requests(None):
            n += 1
            new, changes = adapt_request(req, limits)
            for c in changes:
                counts[c] += 1
            if new is None:
                dropped.append(str(req.id))
            else:
                self._requests.append(new)
        self.adaptation: dict[str, Any] = {"limits": dataclasses.asdict(limits), "requests": n, **counts,
                                           "dropped_ids": dropped[:20]}
        if not any(r.split == "serving" for r in self._requests):
            raise SpecError(f"adapting the pool to {limits} leaves no serving request to replay")
        digest = hashlib.sha256(json.dumps(self.adaptation, sort_keys=True).encode()).hexdigest()[:12]
        self.meta = {**getattr(pool, "meta", {}), "adaptation": self.adaptation}
        self.content_hash = f"{getattr(pool, 'content_hash', '')}+adapted-{digest}"
        self.path = getattr(pool, "path", None)

    def __len__(self) -> int:
        return len(self._requests)

    def iter_requests(self, split: str | None = "serving") -> Iterator[Any]:
        return (r for r in self._requests if split is None or r.split == split)

    def summary(self) -> str:
        a = self.adaptation
        parts = [f"{a[k]} {k.replace('_', ' ')}" for k in ("dropped_over_context", "trimmed_output", "capped_output",
                                                           "tools_stripped", "sampling_stripped") if a.get(k)]
        return (f"pool adapted to the endpoint's limits (max_model_len={self.limits.max_model_len}, "
                f"strip_tools={self.limits.strip_tools}, strip_sampling={list(self.limits.strip_sampling)}"
                + (f", max_output_tokens={self.limits.max_output_tokens}" if self.limits.max_output_tokens else "")
                + "): "
                f"{', '.join(parts) or 'nothing changed'} "
                f"of {a['requests']} requests")


def adapt_to_endpoint(pool: Any, endpoint: EndpointSpec) -> Any:
    """``pool`` as the endpoint's engine is sent it: an ``AdaptedPool`` under its ``engine_options.adapt_pool``
    limits, with its summary printed (an adaptation is never silent); the pool itself when it has none."""
    limits = limits_from_options(endpoint)
    if limits is None:
        return pool
    adapted = AdaptedPool(pool, limits)
    print(adapted.summary())
    return adapted


def write_adapted(pool: Any, limits: PoolLimits, out_dir: Any) -> Any:
    """``pool`` adapted to ``limits``, written as a pool directory of its own (its meta records the adaptation and
    the source pool's hash); returns the pool read back."""
    from autoresearch_dagster.pool.schema import read_pool, write_pool

    adapted = AdaptedPool(pool, limits)
    meta = {k: v for k, v in adapted.meta.items() if k not in ("content_hash",)}
    meta["adapted_from"] = getattr(pool, "content_hash", None)
    write_pool(adapted.iter_requests(None), out_dir, meta)
    return read_pool(out_dir)
