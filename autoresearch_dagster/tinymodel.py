"""Owns the tiny torch transformer with switchable numerics and its OpenAI-compatible logprobs server.

The model is a small causal transformer (RMSNorm, RoPE, multi-head attention, GELU MLP) whose
random weights come from a seed, built in-process: nothing is downloaded. Its vocabulary is the
256 byte values (token i is the character ``chr(i)``), so any text maps to token ids and back.

Numerics switches emulate what a serving engine changes when a lossy knob is set:
- fp8 weights: every linear weight is quantized to ``torch.float8_e4m3fn`` and dequantized
  (per-tensor or per-output-channel scale); ``quantization: fp8`` also quantizes activations
  dynamically per token, as SGLang's online fp8 (w8a8) path does;
- fp8 KV cache: keys (after RoPE) and values pass through fp8 e4m3 / e5m2 with a static scale of
  1.0, SGLang's default when a checkpoint carries no KV scales;
- broken modes for tests of the gate: a missing dequantization scale, a dropped layer, or
  keys left without their rotary position embedding.

The server speaks enough of SGLang's HTTP surface for the correctness gate and the engine's
process-management tests: ``/v1/completions`` (token-id or text prompts, ``echo`` + ``logprobs``
for teacher forcing, ``max_tokens`` including 0, streaming), ``/v1/chat/completions``
(``logprobs`` + ``top_logprobs``), ``/health``, ``/ready``, ``/server_info``, ``/model_info``,
``/v1/models``, ``/flush_cache`` and ``/metrics``. Run as a process it accepts SGLang's launch
flags (``python -m autoresearch_dagster.tinymodel --model-path tiny --port N --quantization fp8``),
so the SGLang engine can be tested end to end without a GPU.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import socket
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from aiohttp import web

from autoresearch_dagster.spec import KNOBS, server_overrides, validate_server_config

VERSION = "tinymodel-1"
VOCAB = 256


# ---------------------------------------------------------------- tokenizer

def encode(text: str) -> list[int]:
    """Characters below 256 are one token each; any other character becomes its UTF-8 bytes."""
    out: list[int] = []
    for ch in text:
        o = ord(ch)
        if o < VOCAB:
            out.append(o)
        else:
            out.extend(ch.encode("utf-8"))
    return out


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


# ---------------------------------------------------------------- numerics

@dataclass(frozen=True)
class Numerics:
    """How the tiny model computes. The default is the fp32 reference."""
    dtype: str = "float32"  # float32 | bfloat16 (compute dtype of weights and activations)
    weight_fp8: str | None = None  # None | per_tensor | per_channel
    act_fp8: bool = False  # dynamic per-token fp8 quantization of linear inputs
    kv_fp8: str | None = None  # None | e4m3 | e5m2
    kv_scale: float = 1.0
    weight_noise: float = 0.0  # relative Gaussian noise on every linear weight (seeded)
    logit_jitter: float = 0.0  # noise on every logit, new on every call: a server whose results vary run to run
    broken: str | None = None  # None | scale | drop_layer | rope

    def label(self) -> str:
        parts = [self.dtype]
        if self.weight_fp8:
            parts.append(f"w-fp8-{self.weight_fp8}")
        if self.act_fp8:
            parts.append("a-fp8")
        if self.kv_fp8:
            parts.append(f"kv-fp8-{self.kv_fp8}")
        if self.weight_noise:
            parts.append(f"noise-{self.weight_noise:g}")
        if self.logit_jitter:
            parts.append(f"jitter-{self.logit_jitter:g}")
        if self.broken:
            parts.append(f"broken-{self.broken}")
        return "+".join(parts)


VARIANTS: dict[str, Numerics] = {
    "reference": Numerics(),
    "bf16": Numerics(dtype="bfloat16"),
    "fp8_weights": Numerics(weight_fp8="per_tensor"),
    "fp8_weights_per_channel": Numerics(weight_fp8="per_channel"),
    "fp8_w8a8": Numerics(weight_fp8="per_tensor", act_fp8=True),
    "fp8_kv": Numerics(kv_fp8="e4m3"),
    "fp8_kv_e5m2": Numerics(kv_fp8="e5m2"),
    "noise_small": Numerics(weight_noise=0.01),
    "jitter": Numerics(logit_jitter=0.02),
    "broken_scale": Numerics(weight_fp8="per_tensor", broken="scale"),
    "broken_layer": Numerics(broken="drop_layer"),
    "broken_rope": Numerics(broken="rope"),
}


def numerics_for(variant: str | Numerics) -> Numerics:
    if isinstance(variant, Numerics):
        return variant
    try:
        return VARIANTS[variant]
    except KeyError:
        raise ValueError(f"unknown tiny-model variant {variant!r}; known: {', '.join(VARIANTS)}") from None


def numerics_from_config(config: dict[str, Any]) -> Numerics:
    """The numerics an SGLang server config implies: the ``Meaning`` of its ``quantization`` and
    ``kv_cache_dtype`` values in ``spec.KNOBS``.

    Scheduling, memory, graph and parallel knobs and speculative decoding with exact verification
    leave the numerics at the reference: the tiny model computes them identically.
    """
    cfg = validate_server_config(config or {})
    n = Numerics()
    weights = KNOBS["quantization"].meaning(cfg.get("quantization"))
    if weights.fp8:  # SGLang's fp8 methods quantize activations dynamically per token
        n = replace(n, weight_fp8=weights.weight_scales, act_fp8=True)
    kv = KNOBS["kv_cache_dtype"].meaning(cfg.get("kv_cache_dtype"))
    if kv.fp8:
        n = replace(n, kv_fp8=kv.fp8)
    return n


_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_qdq(x: torch.Tensor, fmt: str, scale: torch.Tensor | float) -> torch.Tensor:
    """Quantize to fp8 with ``scale`` (x ≈ q * scale) and dequantize back to x's dtype."""
    dt = _FP8[fmt]
    fmax = torch.finfo(dt).max
    q = (x.float() / scale).clamp(-fmax, fmax).to(dt)
    return (q.float() * scale).to(x.dtype)


def _amax_scale(x: torch.Tensor, fmt: str, dim: int | None) -> torch.Tensor:
    fmax = torch.finfo(_FP8[fmt]).max
    amax = x.float().abs().amax() if dim is None else x.float().abs().amax(dim=dim, keepdim=True)
    return amax.clamp(min=1e-12) / fmax


# ---------------------------------------------------------------- model

@dataclass(frozen=True)
class TinyConfig:
    vocab: int = VOCAB
    d_model: int = 96
    n_heads: int = 4
    n_layers: int = 3
    d_ff: int = 256
    max_seq: int = 2048
    logit_scale: float = 6.0  # std of the logits at init: peaked, LM-like next-token distributions
    rope_base: float = 10000.0


_INSTANCES = itertools.count()  # distinct jitter streams per model built in this process


class TinyTransformer:
    """A causal transformer evaluated with plain torch ops so every numerics switch is explicit."""

    def __init__(self, seed: int = 0, numerics: str | Numerics = "reference", cfg: TinyConfig | None = None):
        self.cfg = cfg or TinyConfig()
        self.numerics = numerics_for(numerics)
        self.seed = seed
        self._dtype = torch.bfloat16 if self.numerics.dtype == "bfloat16" else torch.float32
        self.w = self._prepare(self._init_weights(seed))
        self._instance = next(_INSTANCES)
        self._jitter_calls: Counter = Counter()
        self._jitter_lock = threading.Lock()

    def _init_weights(self, seed: int) -> dict[str, torch.Tensor]:
        c = self.cfg
        g = torch.Generator().manual_seed(seed)

        def lin(out_f: int, in_f: int, gain: float = 1.0) -> torch.Tensor:
            return torch.randn(out_f, in_f, generator=g) * (gain / math.sqrt(in_f))

        w: dict[str, torch.Tensor] = {"embed": torch.randn(c.vocab, c.d_model, generator=g)}
        for i in range(c.n_layers):
            w[f"l{i}.wq"] = lin(c.d_model, c.d_model)
            w[f"l{i}.wk"] = lin(c.d_model, c.d_model)
            w[f"l{i}.wv"] = lin(c.d_model, c.d_model)
            w[f"l{i}.wo"] = lin(c.d_model, c.d_model, 0.5)
            w[f"l{i}.w1"] = lin(c.d_ff, c.d_model)
            w[f"l{i}.w2"] = lin(c.d_model, c.d_ff, 0.5)
        w["head"] = lin(c.vocab, c.d_model, c.logit_scale)
        return w

    def _prepare(self, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        n = self.numerics
        out: dict[str, torch.Tensor] = {}
        noise_g = torch.Generator().manual_seed(self.seed + 7919)
        for name, t in w.items():
            is_linear = name != "embed"
            if is_linear and n.weight_noise:
                t = t + torch.randn(t.shape, generator=noise_g) * t.std() * n.weight_noise
            if is_linear and n.weight_fp8:
                scale = _amax_scale(t, "e4m3", None if n.weight_fp8 == "per_tensor" else 1)
                if n.broken == "scale" and name.endswith((".wo", ".w2")):
                    # the output projections skip the dequantization multiply: a classic scale bug
                    fmax = torch.finfo(torch.float8_e4m3fn).max
                    t = (t / scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn).float()
                else:
                    t = fp8_qdq(t, "e4m3", scale)
            out[name] = t.to(self._dtype)
        return out

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if self.numerics.act_fp8:
            x = fp8_qdq(x, "e4m3", _amax_scale(x, "e4m3", -1))
        return x @ self.w[name].T

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        hd = x.shape[-1]
        inv = 1.0 / (self.cfg.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = pos.float()[:, None] * inv[None, :]  # [T, hd/2]
        cos, sin = ang.cos()[None], ang.sin()[None]
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        rot = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        return rot.to(x.dtype)

    @torch.no_grad()
    def _forward(self, ids: list[int], cache: list[tuple[torch.Tensor, torch.Tensor]] | None) -> torch.Tensor:
        """Log-probabilities for the positions of ``ids`` that follow the ``cache``d prefix.

        ``cache`` holds one (K, V) per layer, already through the KV-cache numerics, and is
        extended in place; ``None`` computes the whole sequence without keeping one.
        """
        c, n = self.cfg, self.numerics
        start = cache[0][0].shape[1] if cache else 0
        if start + len(ids) > c.max_seq:
            raise ValueError(f"sequence of {start + len(ids)} tokens exceeds the tiny model's context of {c.max_seq}")
        if min(ids) < 0 or max(ids) >= c.vocab:
            raise ValueError(f"token ids must be in [0, {c.vocab})")
        T, H = len(ids), c.n_heads
        hd = c.d_model // H
        x = self.w["embed"][torch.tensor(ids)]
        pos = torch.arange(start, start + T)
        mask = torch.full((T, start + T), float("-inf")).triu(start + 1)
        layers = range(c.n_layers - 1) if n.broken == "drop_layer" else range(c.n_layers)
        for li, i in enumerate(layers):
            h = self._rms(x)
            q = self._linear(h, f"l{i}.wq").view(T, H, hd).transpose(0, 1)
            k = self._linear(h, f"l{i}.wk").view(T, H, hd).transpose(0, 1)
            v = self._linear(h, f"l{i}.wv").view(T, H, hd).transpose(0, 1)
            q = self._rope(q, pos)
            if n.broken != "rope":  # the broken mode forgets to rotate the keys
                k = self._rope(k, pos)
            if n.kv_fp8:
                k = fp8_qdq(k, n.kv_fp8, n.kv_scale)
                v = fp8_qdq(v, n.kv_fp8, n.kv_scale)
            if cache is not None:
                if len(cache) <= li:
                    cache.append((k, v))
                else:
                    k = torch.cat([cache[li][0], k], dim=1)
                    v = torch.cat([cache[li][1], v], dim=1)
                    cache[li] = (k, v)
            att = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(hd) + mask
            o = (att.softmax(-1) @ v.float()).to(x.dtype).transpose(0, 1).reshape(T, c.d_model)
            x = x + self._linear(o, f"l{i}.wo")
            h = self._rms(x)
            x = x + self._linear(torch.nn.functional.gelu(self._linear(h, f"l{i}.w1")), f"l{i}.w2")
        logits = self._linear(self._rms(x), "head").float()
        if n.logit_jitter:
            # like batch-dependent reduction order on a GPU: differs between calls, not between positions' meaning
            logits = logits + self._jitter(logits.shape, start, ids) * n.logit_jitter
        return torch.log_softmax(logits, dim=-1)

    def _jitter(self, shape: torch.Size, start: int, ids: list[int]) -> torch.Tensor:
        """Standard normal noise that differs between calls (the k-th call for the same positions and tokens,
        on this instance, draws the k-th stream) yet does not depend on how concurrent requests interleave,
        so a test of a jittery server sees the same numbers on every run."""
        key = (start, tuple(ids))
        with self._jitter_lock:
            k = self._jitter_calls[key]
            self._jitter_calls[key] += 1
        g = torch.Generator().manual_seed(zlib.crc32(repr((self._instance, self.seed, k, key)).encode()))
        return torch.randn(shape, generator=g)

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """Log-probabilities [T, vocab] of the next token after each prefix of ``ids`` (float32)."""
        if not ids:
            raise ValueError("cannot score an empty token sequence")
        return self._forward(list(ids), None)

    def generate(self, ids: list[int], max_tokens: int, *, temperature: float = 0.0,
                 seed: int | None = None) -> tuple[list[int], torch.Tensor]:
        """Continue ``ids`` with a KV cache; returns the new tokens and the log-probabilities that chose each."""
        if not ids:
            raise ValueError("cannot continue an empty prompt")
        new: list[int] = []
        rows: list[torch.Tensor] = []
        g = torch.Generator().manual_seed(seed if seed is not None else self.seed)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        lp = self._forward(list(ids), cache)[-1] if max_tokens > 0 else None
        for step in range(max_tokens):
            if temperature <= 0:
                tok = int(torch.argmax(lp))
            else:
                tok = int(torch.multinomial(torch.softmax(lp / temperature, -1), 1, generator=g))
            rows.append(lp)
            new.append(tok)
            if step + 1 < max_tokens:
                lp = self._forward([tok], cache)[-1]
        return new, (torch.stack(rows) if rows else torch.empty(0, self.cfg.vocab))


# ---------------------------------------------------------------- OpenAI-compatible server

def _top(lp_row: torch.Tensor, k: int) -> dict[str, float]:
    vals, idx = torch.topk(lp_row, k)
    return {chr(int(i)): float(v) for v, i in zip(vals, idx)}


def _completion_logprobs(all_ids: list[int], lp: torch.Tensor, start: int, k: int) -> dict[str, Any]:
    """OpenAI legacy logprobs for tokens all_ids[start:].

    ``lp`` holds the rows that predicted the last ``len(lp)`` tokens of ``all_ids`` (the full
    sequence's rows without the final one, or only the generated tokens' rows).
    """
    offset = len(all_ids) - len(lp)  # the token that lp's first row predicted
    first = max(start, 1)
    rows = lp[first - offset: len(all_ids) - offset] if first < len(all_ids) else lp[:0]
    forced = torch.tensor(all_ids[first:], dtype=torch.long)
    token_lps = rows.gather(1, forced[:, None])[:, 0].tolist() if len(forced) else []
    tops: list[dict[str, float] | None] = []
    if k > 0 and len(rows):
        vals, idx = torch.topk(rows, k, dim=-1)
        tops = [{chr(i): v for i, v in zip(ii, vv)} for ii, vv in zip(idx.tolist(), vals.tolist())]
    else:
        tops = [{} for _ in range(len(rows))]
    lead = [None] if start == 0 else []
    return {"tokens": [chr(t) for t in all_ids[start:]], "token_logprobs": lead + token_lps, "top_logprobs": lead + tops,
            "text_offset": list(range(len(all_ids) - start))}


class TinyServer:
    """aiohttp app serving one TinyTransformer; ``server_args`` is what /server_info reports."""

    def __init__(self, model: TinyTransformer, *, model_name: str = "tiny",
                 server_args: dict[str, Any] | None = None, max_logprobs: int = 20, echo_logprobs: bool = True):
        self.model = model
        self.echo_logprobs = echo_logprobs  # False: like servers that return logprobs for generated tokens only
        self.model_name = model_name
        self.server_args = dict(server_args or {})
        self.max_logprobs = max_logprobs
        self.counters = {"num_requests_total": 0, "prompt_tokens_total": 0, "generation_tokens_total": 0}
        self._lock = threading.Lock()  # one forward at a time: the model is not re-entrant across threads
        self.app = web.Application(client_max_size=16 * 1024 * 1024)
        r = self.app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.ok)
        r.add_get("/health_generate", self.ok)
        r.add_get("/ready", self.ok)
        r.add_get("/server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/metrics", self.metrics)

    async def ok(self, _req: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def models(self, _req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "tinymodel", "max_model_len": self.model.cfg.max_seq}]})

    async def server_info(self, _req: web.Request) -> web.Response:
        return web.json_response({**self.server_args, "version": VERSION, "numerics": self.model.numerics.label(),
                                  "numerics_detail": asdict(self.model.numerics), "tiny_seed": self.model.seed})

    async def model_info(self, _req: web.Request) -> web.Response:
        return web.json_response({"model_path": self.server_args.get("model_path", "tiny"),
                                  "served_model_name": self.model_name, "is_generation": True})

    async def flush_cache(self, _req: web.Request) -> web.Response:
        return web.Response(text="Cache flushed. (the tiny model keeps no prefix cache)")

    async def metrics(self, _req: web.Request) -> web.Response:
        lines = []
        for name, v in self.counters.items():
            lines += [f"# TYPE sglang:{name} counter", f'sglang:{name}{{model_name="{self.model_name}"}} {v}']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    @staticmethod
    def _err(msg: str, status: int = 400) -> web.Response:
        return web.json_response({"object": "error", "message": msg, "type": "BadRequestError", "code": status},
                                  status=status)

    async def _run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()

        def locked():
            with self._lock:
                return fn(*args, **kwargs)
        return await loop.run_in_executor(None, locked)

    def _parse_common(self, body: dict[str, Any]) -> tuple[int, float, int | None]:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
        if max_tokens is None:
            max_tokens = 16
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        seed = body.get("seed")
        return max_tokens, temperature, seed

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return encode(prompt)
        if isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            return list(prompt)
        raise ValueError("prompt must be a string, a list of token ids, or a one-element list of either")

    async def completions(self, req: web.Request) -> web.StreamResponse:
        try:
            body = await req.json()
            ids = self._prompt_ids(body.get("prompt"))
            max_tokens, temperature, seed = self._parse_common(body)
            k = body.get("logprobs")
            k = None if k is None else int(k)
            if k is not None and not 0 <= k <= self.max_logprobs:
                raise ValueError(f"logprobs must be between 0 and {self.max_logprobs}")
            echo = bool(body.get("echo", False))
            if max_tokens == 0 and not echo:
                raise ValueError("max_tokens=0 is only meaningful with echo=true")
            new, rows = await self._run(self.model.generate, ids, max_tokens, temperature=temperature, seed=seed)
            all_ids = ids + new
            lp = None
            if k is not None:
                # scoring the prompt needs a full forward; generated tokens already have their rows
                lp = (await self._run(self.model.logprobs, all_ids))[:-1] if echo and self.echo_logprobs else rows
        except (ValueError, TypeError, json.JSONDecodeError) as e:
            return self._err(str(e))
        self._count(len(ids), len(new))
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(new), "total_tokens": len(all_ids)}
        rid = "cmpl-" + uuid.uuid4().hex[:16]
        if body.get("stream"):
            return await self._stream_completion(req, rid, ids, new, lp, k, echo, usage, body)
        logprobs = None
        if lp is not None:
            logprobs = _completion_logprobs(all_ids, lp, 0 if echo and self.echo_logprobs else len(ids), k)
        text = decode(all_ids) if echo else decode(new)
        return web.json_response({
            "id": rid, "object": "text_completion", "created": int(time.time()), "model": self.model_name,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": "length"}],
            "usage": usage})

    async def _stream_completion(self, req, rid, ids, new, lp, k, echo, usage, body) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)
        all_ids = ids + new

        async def send(obj: dict) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.model_name}
        if echo:
            await send({**base, "choices": [{"index": 0, "text": decode(ids), "logprobs": None, "finish_reason": None}]})
        full = _completion_logprobs(all_ids, lp, len(ids), k) if lp is not None else None
        for j, tok in enumerate(new):
            chunk_lp = None
            if full is not None:
                chunk_lp = {"tokens": [full["tokens"][j]], "token_logprobs": [full["token_logprobs"][j]],
                            "top_logprobs": [full["top_logprobs"][j]], "text_offset": [0]}
            last = j == len(new) - 1
            await send({**base, "choices": [{"index": 0, "text": chr(tok), "logprobs": chunk_lp,
                                             "finish_reason": "length" if last else None}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({**base, "choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def chat(self, req: web.Request) -> web.StreamResponse:
        from autoresearch_dagster.tokens import render_prompt
        try:
            body = await req.json()
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
            ids = encode(render_prompt(messages, body.get("tools")))
            max_tokens, temperature, seed = self._parse_common(body)
            want_lp = bool(body.get("logprobs", False))
            k = int(body.get("top_logprobs") or 0)
            if not 0 <= k <= self.max_logprobs:
                raise ValueError(f"top_logprobs must be between 0 and {self.max_logprobs}")
            new, rows = await self._run(self.model.generate, ids, max(max_tokens, 1), temperature=temperature, seed=seed)
        except (ValueError, TypeError, json.JSONDecodeError) as e:
            return self._err(str(e))
        self._count(len(ids), len(new))
        content = None
        if want_lp:
            content = []
            for tok, row in zip(new, rows):
                content.append({"token": chr(tok), "logprob": float(row[tok]), "bytes": [tok],
                                "top_logprobs": [{"token": t, "logprob": v, "bytes": [ord(t)]}
                                                 for t, v in _top(row, k).items()] if k else []})
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(new), "total_tokens": len(ids) + len(new)}
        rid = "chatcmpl-" + uuid.uuid4().hex[:16]
        base = {"id": rid, "created": int(time.time()), "model": self.model_name}
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(req)
            for j, tok in enumerate(new):
                choice = {"index": 0, "delta": {"role": "assistant", "content": chr(tok)} if j == 0 else {"content": chr(tok)},
                          "logprobs": {"content": [content[j]]} if content else None,
                          "finish_reason": "length" if j == len(new) - 1 else None}
                await resp.write(b"data: " + json.dumps({**base, "object": "chat.completion.chunk",
                                                         "choices": [choice]}).encode() + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(b"data: " + json.dumps({**base, "object": "chat.completion.chunk", "choices": [],
                                                         "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({**base, "object": "chat.completion", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": decode(new)},
            "logprobs": {"content": content} if content is not None else None, "finish_reason": "length"}],
            "usage": usage})

    def _count(self, prompt_tokens: int, gen_tokens: int) -> None:
        self.counters["num_requests_total"] += 1
        self.counters["prompt_tokens_total"] += prompt_tokens
        self.counters["generation_tokens_total"] += gen_tokens


# ---------------------------------------------------------------- running it

class RunningTinyServer:
    """A TinyServer on its own event loop in a daemon thread; ``stop()`` shuts it down."""

    def __init__(self, server: TinyServer, host: str = "127.0.0.1", port: int = 0):
        self.server = server
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.base_url = f"http://{self.host}:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        started = threading.Event()
        self._error: BaseException | None = None

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._runner = web.AppRunner(server.app, access_log=None)
                self._loop.run_until_complete(self._runner.setup())
                self._loop.run_until_complete(web.SockSite(self._runner, self._sock).start())
            except BaseException as e:  # surfaced to the caller below
                self._error = e
                started.set()
                return
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"tinymodel:{self.port}", daemon=True)
        self._thread.start()
        started.wait(30)
        if self._error:
            raise RuntimeError(f"tiny model server failed to start: {self._error}")

    def wait(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        if not self._loop.is_running():
            return
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._sock.close()

    def __enter__(self) -> "RunningTinyServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_tiny_model_in_thread(variant: str | Numerics = "reference", seed: int = 0, *, host: str = "127.0.0.1",
                               port: int = 0, model_name: str = "tiny",
                               server_args: dict[str, Any] | None = None, echo_logprobs: bool = True) -> RunningTinyServer:
    """Serve the tiny model with these numerics on a free loopback port; returns ``.base_url`` and ``.stop()``."""
    model = TinyTransformer(seed=seed, numerics=variant)
    return RunningTinyServer(TinyServer(model, model_name=model_name, server_args=server_args,
                                        echo_logprobs=echo_logprobs), host, port)


# ---------------------------------------------------------------- SGLang-compatible launcher

def resolve_server_args(config: dict[str, Any]) -> dict[str, Any]:
    """Resolved knob values as the tiny server reports them in /server_info.

    Set knobs are reported as given, unset ones at their KNOBS default, then SGLang's rules that
    override a value the user set (``spec.server_overrides``: e.g. NGRAM turns mixed chunking off),
    so asking for both shows up as config drift, as it would on a real server.
    """
    return server_overrides({**{name: k.default for name, k in KNOBS.items()}, **config})


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autoresearch_dagster.tinymodel",
                                description="Serve the tiny torch model behind SGLang's launch flags (CPU, for tests).")
    p.add_argument("--model-path", required=True, help="'tiny' (weights come from --random-seed)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--log-level", default="info")
    p.add_argument("--variant", default=None, help="force a named numerics variant (tests of broken servers)")
    for name, k in KNOBS.items():
        if k.type is bool:
            p.add_argument(k.flag, dest=name, action="store_true", default=None)
        else:
            p.add_argument(k.flag, dest=name, type=k.type, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    config = {name: getattr(args, name) for name in KNOBS if getattr(args, name) is not None}
    try:
        config = validate_server_config(config)
    except ValueError as e:
        print(f"tinymodel: error: {e}", file=sys.stderr)
        return 2
    numerics = numerics_for(args.variant) if args.variant else numerics_from_config(config)
    server_args = {**resolve_server_args(config), "model_path": args.model_path, "host": args.host,
                   "port": args.port, "random_seed": args.random_seed, "enable_metrics": args.enable_metrics,
                   "enable_cache_report": args.enable_cache_report, "launch_command": " ".join(sys.argv)}
    torch.set_num_threads(1)
    running = serve_tiny_model_in_thread(numerics, args.random_seed, host=args.host, port=args.port,
                                         model_name=args.served_model_name or args.model_path, server_args=server_args)
    print(f"tinymodel serving {numerics.label()} on {running.base_url} (pid {os.getpid()})", flush=True)
    try:
        running._thread.join()
    except KeyboardInterrupt:
        running.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
