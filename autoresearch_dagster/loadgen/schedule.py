"""Owns arrival schedules and the rebuilding of pool requests into runnable OpenAI request bodies.

Schedules are absolute send offsets (seconds from the step start), never gaps to sleep: the runner
paces on deadlines, so an offset list fully determines what the client intends to offer and a
server-side arrival log can be checked against it exactly.

- ``poisson_offsets``: exponential inter-arrivals, or gamma ones with a burstiness factor
  (vLLM's convention: burstiness = gamma shape, CV of the gaps = 1/sqrt(burstiness); < 1 is
  burstier than Poisson, > 1 smoother, 1 is Poisson).
- ``shape_offsets``: the production shape of a pool: per-interval request counts from its arrival
  timestamps, replayed ``speedup`` times faster, each send time drawn uniformly inside its interval.
- ``recorded_offsets``: the pool's own arrival times, as production sent them (the replay-vs-production
  check replays these).
- ``build_schedule``: pool requests → ``ScheduledRequest`` with the body rebuilt faithfully
  (messages/prompt, tools, tool_choice, response_format, sampling) and the output length pinned.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Iterable

import numpy as np

from autoresearch_dagster.loadgen.records import ScheduledRequest

# Sampling keys the OpenAI APIs (and SGLang's extras) accept in the body, copied from the pool as-is.
_RUNNER_KEYS = ("model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "ignore_eos")


def poisson_offsets(rate_rps: float, duration_s: float, *, seed: int, burstiness: float = 1.0) -> list[float]:
    """Send offsets in [0, duration_s) for an open-loop arrival process at ``rate_rps``."""
    if rate_rps <= 0 or not math.isfinite(rate_rps):
        raise ValueError(f"rate_rps must be a positive finite number, got {rate_rps!r}")
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s!r}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness!r}")
    rng = np.random.default_rng(seed)
    expected = rate_rps * duration_s
    offsets: list[float] = []
    t = 0.0
    while True:
        # Draw in blocks: a few draws past the end are cheaper than a Python loop per arrival.
        n = max(16, int(expected * 1.2 - len(offsets)) + 16)
        if burstiness == 1.0:
            gaps = rng.exponential(1.0 / rate_rps, n)
        else:
            gaps = rng.gamma(burstiness, 1.0 / (rate_rps * burstiness), n)
        times = t + np.cumsum(gaps)
        inside = times[times < duration_s]
        offsets.extend(inside.tolist())
        if len(inside) < n:
            return offsets
        t = float(times[-1])


_SERVING_CACHE: "weakref.WeakKeyDictionary[Any, list[Any]]" = weakref.WeakKeyDictionary()


def _serving(pool: Any) -> list[Any]:
    """The pool's serving requests, materialized once per pool object (every load step reuses them)."""
    try:
        return _SERVING_CACHE[pool]
    except (KeyError, TypeError):
        reqs = list(pool.iter_requests("serving"))
    try:
        _SERVING_CACHE[pool] = reqs
    except TypeError:  # not weak-referenceable: no caching
        pass
    return reqs


def interval_counts(arrivals: Iterable[float], interval_s: float) -> tuple[float, list[int]]:
    """(first arrival, requests per interval of ``interval_s`` seconds of the original timeline)."""
    arr = np.sort(np.asarray(list(arrivals), dtype=float))
    if arr.size == 0:
        return 0.0, []
    t0 = float(arr[0])
    idx = np.floor((arr - t0) / interval_s).astype(int)
    return t0, np.bincount(idx).tolist()


def shape_offsets(pool: Any, *, speedup: float, interval_s: float, seed: int) -> list[float]:
    """Send offsets that follow the pool's production shape, aligned with its serving requests.

    ``offsets[i]`` belongs to the i-th request of ``pool.iter_requests("serving")``. Each request
    keeps its interval of the original timeline (so per-interval target rates are the pool's, times
    ``speedup``) and gets a uniformly random time inside that interval, compressed by ``speedup``.
    """
    if speedup <= 0:
        raise ValueError(f"speedup must be positive, got {speedup!r}")
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s!r}")
    reqs = _serving(pool)
    if not reqs:
        raise ValueError("the pool has no serving requests to replay")
    arrivals = np.asarray([float(r.arrival_s) for r in reqs])
    t0 = float(arrivals.min())
    interval_idx = np.floor((arrivals - t0) / interval_s)
    rng = np.random.default_rng(seed)
    original = (interval_idx + rng.random(len(reqs))) * interval_s
    return (original / speedup).tolist()


def recorded_offsets(pool: Any) -> list[float]:
    """The requests' own arrival times, from the first one: production's timing, as recorded.

    ``offsets[i]`` belongs to the i-th request of ``pool.iter_requests("serving")`` (a replay at
    production speed; ``shape_offsets`` redraws each time inside its interval instead).
    """
    reqs = _serving(pool)
    if not reqs:
        raise ValueError("the pool has no serving requests to replay")
    arrivals = np.asarray([float(r.arrival_s) for r in reqs])
    return (arrivals - arrivals.min()).tolist()


def request_body(req: Any, *, model: str, pin_output: bool = True, ignore_eos: bool = True) -> dict[str, Any]:
    """The OpenAI request body of a pool request, streaming with usage, output length pinned.

    Starts from ``req.body()`` (the pool's own rendering) and makes sure every recorded part is
    present: messages or prompt, tools, tool_choice, response_format and each sampling parameter.
    """
    body: dict[str, Any] = dict(req.body()) if callable(getattr(req, "body", None)) else {}
    if req.api == "chat":
        body.setdefault("messages", req.messages or [])
    else:
        body.setdefault("prompt", req.prompt if req.prompt is not None else "")
    for key in ("tools", "tool_choice", "response_format"):
        value = getattr(req, key, None)
        if value is not None:
            body.setdefault(key, value)
    for key, value in (req.sampling or {}).items():
        if key not in _RUNNER_KEYS:
            body.setdefault(key, value)
    body["model"] = model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if pin_output and req.output_tokens and req.output_tokens > 0:
        body["max_tokens"] = int(req.output_tokens)
        if req.api == "chat":
            body["max_completion_tokens"] = int(req.output_tokens)
        if ignore_eos:
            body["ignore_eos"] = True  # SGLang/vLLM extra: generate exactly the pinned length
    else:
        sampling = req.sampling or {}
        for key in ("max_tokens", "max_completion_tokens"):
            if key in sampling:
                body[key] = sampling[key]
    return body


def build_schedule(pool: Any, offsets: list[float], *, model: str, seed: int, start_index: int = 0,
                   pin_output: bool = True, ignore_eos: bool = True,
                   aligned: bool = False) -> list[ScheduledRequest]:
    """Pair send offsets with pool requests and rebuild their bodies; sorted by send offset.

    By default requests are taken in pool order from ``start_index`` (wrapping around), so that
    successive load steps replay different requests. ``aligned=True`` pairs ``offsets[i]`` with
    the i-th serving request (what ``shape_offsets`` returns). ``seed`` names the schedule in the
    request ids, so ids stay unique across steps. ``pool_row`` is the request's index among the
    pool's serving requests.
    """
    reqs = _serving(pool)
    if not reqs:
        raise ValueError("the pool has no serving requests to replay")
    if aligned and len(offsets) != len(reqs):
        raise ValueError(f"aligned schedule needs one offset per serving request ({len(reqs)}), got {len(offsets)}")
    out: list[ScheduledRequest] = []
    for i, off in enumerate(offsets):
        row = i if aligned else (start_index + i) % len(reqs)
        req = reqs[row]
        out.append(ScheduledRequest(
            request_id=f"s{seed}-{i}-{req.id}",
            send_offset_s=float(off),
            api=req.api,
            body=request_body(req, model=model, pin_output=pin_output, ignore_eos=ignore_eos),
            prompt_tokens=int(req.prompt_tokens),
            output_tokens=int(req.output_tokens),
            block_hashes=list(req.block_hashes or []),
            block_tokens=int(req.block_tokens or 64),
            pool_row=row,
        ))
    out.sort(key=lambda s: s.send_offset_s)
    return out
