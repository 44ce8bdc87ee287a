"""Owns the emulator server's OpenAI-compatible wire format: request validation, generated text, response bodies and SSE chunks.

Pure functions only (no I/O): the aiohttp handlers in ``server.py`` call them. Shapes follow
SGLang 0.5.23's OpenAI protocol (``entrypoints/openai/protocol.py``): a streamed chat answer is a
role+content chunk, content chunks, a chunk with an empty delta carrying ``finish_reason``, then
(with ``stream_options.include_usage``) a chunk with ``choices: []`` and ``usage``, then
``data: [DONE]``. Streamed completions carry ``finish_reason`` on the last text chunk.

Generated text is deterministic filler from ``tokens.synth_text``: every piece is one approx token,
so ``count_tokens(text) == usage.completion_tokens``. Log-probabilities are plausible deterministic
numbers in OpenAI's format, not a model's: nothing downstream may treat them as model output (the
correctness gate uses a tiny torch model instead).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from autoresearch_dagster.tokens import block_hashes, count_tokens, render_prompt, synth_text

Api = Literal["chat", "completions"]
_ROLES = {"system", "user", "assistant", "tool", "developer", "function"}
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
MAX_TOP_LOGPROBS = 20
# Output-length draw when the client does not pin it with ignore_eos: log-normal with this median
# and shape, a typical chat-answer spread; capped by max_tokens and the context window.
OUTPUT_MEDIAN_TOKENS = 200
OUTPUT_SIGMA = 0.8


class RequestError(ValueError):
    """A request the server rejects; ``param`` names the offending field, ``status`` the HTTP code."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_body(message: str, *, status: int = 400, param: str | None = None) -> dict[str, Any]:
    """SGLang's ErrorResponse shape (the openai SDK surfaces ``message`` in its exception)."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return {"object": "error", "message": message, "type": kind, "param": param, "code": status}


@dataclass
class GenRequest:
    """One validated generation request, reduced to what the engine and the response need."""
    api: Api
    model: str | None
    prompt_text: str  # rendered prompt; its approx tokenization defines prompt_tokens and prefix blocks
    prompt_tokens: int
    max_tokens: int  # the client's limit, else what the context window leaves
    min_tokens: int = 0
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False
    echo_text: str = ""
    seed: int | None = None
    rid: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def block_hashes(self, block_tokens: int) -> list[int]:
        return block_hashes(self.prompt_text, block_tokens)


def _int_field(body: dict, name: str, *, low: int, high: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"'{name}' must be an integer, got {v!r}", name)
    if v < low or (high is not None and v > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise RequestError(f"'{name}' must be {bound}, got {v}", name)
    return v


def _bool_field(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be true or false, got {v!r}", name)
    return v


def _ids_text(ids: list[int]) -> str:
    """A text in which each token id is exactly one approx token (a base-26 word of <= 6 letters)."""
    out = []
    for i in ids:
        w = ""
        i = i % 308_915_776  # 26**6: keeps every id to one approx token
        while True:
            i, r = divmod(i, 26)
            w += _LETTERS[r]
            if i == 0:
                break
        out.append(" " + w)
    return "".join(out)


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
        role = m.get("role")
        if role not in _ROLES:
            raise RequestError(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}", "messages")
        content = m.get("content")
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise RequestError(f"messages[{i}].content is required (null only for assistant tool calls)", "messages")
        if content is not None and not isinstance(content, (str, list)):
            raise RequestError(f"messages[{i}].content must be a string or a list of content parts", "messages")
    return messages


def _prompt(body: dict) -> tuple[str, int]:
    """(prompt text, prompt tokens) of a completions request."""
    p = body.get("prompt")
    if p is None:
        raise RequestError("'prompt' is required for /v1/completions", "prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        return p, count_tokens(p)
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
        return _ids_text(p), len(p)
    if isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
        raise RequestError(f"batched prompts ({len(p)} prompts) are not supported by the emulator; "
                           "send one prompt per request", "prompt")
    raise RequestError("'prompt' must be a string, a list of token ids, or a list with one of those", "prompt")


def parse_request(api: Api, body: Any, *, context_len: int) -> GenRequest:
    """Validate an OpenAI request body; raise RequestError naming the field on anything unusable."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"'model' must be a string, got {model!r}", "model")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise RequestError(f"'n' = {n!r} is not supported: the emulator returns exactly one choice per request "
                           "(n must be 1)", "n")
    best_of = body.get("best_of", 1)
    if best_of is not None and best_of != 1:
        raise RequestError(f"'best_of' = {best_of!r} is not supported (must be 1)", "best_of")
    stream = _bool_field(body, "stream")
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise RequestError("'stream_options' can only be set when 'stream' is true", "stream_options")
        if not isinstance(opts, dict):
            raise RequestError("'stream_options' must be an object", "stream_options")
    opts = opts or {}
    include_usage = _bool_field(opts, "include_usage")
    continuous = _bool_field(opts, "continuous_usage_stats")
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise RequestError(f"'{name}' must be a number, got {v!r}", name)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise RequestError("'stop' must be a string or a list of strings", "stop")
    seed = _int_field(body, "seed", low=-(2 ** 63))
    ignore_eos = _bool_field(body, "ignore_eos")
    min_tokens = _int_field(body, "min_tokens", low=0) or 0
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("'rid' must be a string", "rid")

    echo = False
    echo_text = ""
    if api == "chat":
        messages = _check_messages(body.get("messages"))
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise RequestError("'tools' must be a list", "tools")
        text = render_prompt(messages, tools)
        prompt_tokens = count_tokens(text)
        max_tokens = _int_field(body, "max_completion_tokens", low=1)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", low=1)
        logprobs = _bool_field(body, "logprobs")
        top = _int_field(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS) or 0
        if top and not logprobs:
            raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    else:
        text, prompt_tokens = _prompt(body)
        max_tokens = _int_field(body, "max_tokens", low=1)
        if "max_tokens" not in body:
            max_tokens = 16  # the OpenAI / SGLang default for /v1/completions
        lp = body.get("logprobs")
        if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_TOP_LOGPROBS):
            raise RequestError(f"'logprobs' for /v1/completions is the number of top log-probabilities "
                               f"(0..{MAX_TOP_LOGPROBS}), got {lp!r}", "logprobs")
        logprobs, top = lp is not None, (lp or 0)
        echo = _bool_field(body, "echo")
        if echo:
            echo_text = body["prompt"] if isinstance(body["prompt"], str) else ""

    if prompt_tokens >= context_len:
        raise RequestError(f"the prompt has {prompt_tokens} tokens, at or above the model's context length "
                           f"{context_len}", "messages" if api == "chat" else "prompt")
    room = context_len - prompt_tokens
    if max_tokens is not None and max_tokens > room:
        raise RequestError(f"requested {prompt_tokens} prompt + {max_tokens} output tokens, more than the model's "
                           f"context length {context_len}", "max_tokens")
    if min_tokens and max_tokens is not None and min_tokens > max_tokens:
        raise RequestError(f"'min_tokens' ({min_tokens}) exceeds the maximum output length ({max_tokens})", "min_tokens")
    return GenRequest(api=api, model=model, prompt_text=text, prompt_tokens=prompt_tokens,
                      max_tokens=max_tokens if max_tokens is not None else room, min_tokens=min_tokens,
                      ignore_eos=ignore_eos, stream=stream, include_usage=include_usage, continuous_usage=continuous,
                      logprobs=logprobs, top_logprobs=top, echo=echo, echo_text=echo_text, seed=seed, rid=rid)


def _digest(*parts: Any) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big") >> 1


def text_seed(req: GenRequest, server_seed: int) -> int:
    """Seed of the generated text and length draw: the same request to the same server gives the same answer."""
    return _digest(server_seed, req.api, req.prompt_text, req.seed)


def output_length(req: GenRequest, server_seed: int) -> int:
    """Tokens to generate: max_tokens with ignore_eos, else a seeded log-normal draw capped by max_tokens."""
    cap = max(1, req.max_tokens or 1)
    if req.ignore_eos:
        return cap
    rng = random.Random(text_seed(req, server_seed) ^ 0x5EED)
    drawn = int(round(rng.lognormvariate(math.log(OUTPUT_MEDIAN_TOKENS), OUTPUT_SIGMA)))
    return min(cap, max(1, req.min_tokens, drawn))


class TextPieces:
    """The generated answer as one-approx-token pieces, extended on demand (the engine decides the length)."""

    def __init__(self, seed: int, n: int):
        self._seed = seed
        self._pieces: list[str] = []
        self._ensure(n)

    def _ensure(self, n: int) -> None:
        while len(self._pieces) < n:
            more = max(n - len(self._pieces), 16)
            words = synth_text(more, self._seed + len(self._pieces)).split(" ")[1:]
            self._pieces.extend(" " + w for w in words)

    def text(self, start: int, end: int) -> str:
        self._ensure(end)
        return "".join(self._pieces[start:end])

    def pieces(self, start: int, end: int) -> list[str]:
        self._ensure(end)
        return self._pieces[start:end]


def _alternatives(seed: int, k: int) -> list[str]:
    return [" " + w for w in synth_text(k, seed).split(" ")[1:]] if k else []


def _token_logprobs(seed: int, index: int, piece: str, top: int) -> tuple[float, list[tuple[str, float]]]:
    """(logprob of the chosen token, top alternatives sorted by logprob) — deterministic, not a model's."""
    rng = random.Random(_digest(seed, index))
    chosen = -rng.expovariate(4.0)  # mostly confident picks, mean -0.25 nats
    alts: list[tuple[str, float]] = [(piece, chosen)]
    lp = chosen
    for w in _alternatives(_digest(seed, index, "alt"), max(0, top - 1) * 2):
        if len(alts) >= top:
            break
        if any(w == a for a, _ in alts):
            continue
        lp -= 0.5 + rng.expovariate(1.0)
        alts.append((w, lp))
    return chosen, alts[:top]


def chat_logprobs(seed: int, start: int, pieces: list[str], top: int) -> dict[str, Any]:
    content = []
    for j, piece in enumerate(pieces):
        lp, alts = _token_logprobs(seed, start + j, piece, top)
        content.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()),
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alts]})
    return {"content": content}


def completion_logprobs(seed: int, start: int, pieces: list[str], top: int, text_offset: int) -> dict[str, Any]:
    tokens, token_lps, tops, offsets = [], [], [], []
    off = text_offset
    for j, piece in enumerate(pieces):
        lp, alts = _token_logprobs(seed, start + j, piece, top)
        tokens.append(piece)
        token_lps.append(lp)
        tops.append({t: v for t, v in alts} if top else None)
        offsets.append(off)
        off += len(piece)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class ResponseWriter:
    """Builds one request's response bodies; streamed chunks are assembled from pre-serialized fragments."""

    def __init__(self, req: GenRequest, *, rid: str, model: str, text_seed: int, pieces: TextPieces):
        self.req = req
        self.rid = rid
        self.model = model
        self.seed = text_seed
        self.pieces = pieces
        self.created = int(time.time())
        chat = req.api == "chat"
        self.id = ("chatcmpl-" if chat else "cmpl-") + rid
        head = {"id": self.id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": self.created, "model": model}
        self._head = json.dumps(head)[:-1]  # '{"id": ..., "model": "m"' — chunks append their choices
        self._text_offset = len(req.echo_text)

    def final_reason(self, completion_tokens: int) -> str:
        return "length" if completion_tokens >= (self.req.max_tokens or 0) or self.req.ignore_eos else "stop"

    # ---- streaming
    def chunk(self, start: int, end: int, *, first: bool, finish_reason: str | None = None,
              usage_now: dict | None = None) -> str:
        """SSE event(s) carrying output tokens [start, end) (plus the echoed prompt / role on the first chunk)."""
        req = self.req
        text = self.pieces.text(start, end)
        lp = None
        if req.logprobs:
            ps = self.pieces.pieces(start, end)
            if req.api == "chat":
                lp = chat_logprobs(self.seed, start, ps, req.top_logprobs)
            else:
                lp = completion_logprobs(self.seed, start, ps, req.top_logprobs, self._text_offset)
                self._text_offset += len(text)
        tail = f', "usage": {json.dumps(usage_now)}}}\n\n' if usage_now is not None else ', "usage": null}\n\n'
        lp_s = json.dumps(lp)
        if req.api == "chat":
            role = '"role": "assistant", ' if first else ""
            choice = (f'{{"index": 0, "delta": {{{role}"content": {json.dumps(text)}}}, "logprobs": {lp_s}, '
                      f'"finish_reason": null, "matched_stop": null}}')
            out = f'data: {self._head}, "choices": [{choice}]{tail}'
            return out + self.finish_chunk(finish_reason) if finish_reason else out
        if first and req.echo:
            text = req.echo_text + text
        fr = f'"{finish_reason}"' if finish_reason else "null"
        choice = f'{{"index": 0, "text": {json.dumps(text)}, "logprobs": {lp_s}, "finish_reason": {fr}, "matched_stop": null}}'
        return f'data: {self._head}, "choices": [{choice}]{tail}'

    def finish_chunk(self, finish_reason: str) -> str:
        """The chunk that closes the choice: an empty delta (chat) or empty text (completions) with the reason."""
        if self.req.api == "chat":
            fin = (f'{{"index": 0, "delta": {{}}, "logprobs": null, "finish_reason": "{finish_reason}", '
                   f'"matched_stop": null}}')
        else:
            fin = (f'{{"index": 0, "text": "", "logprobs": null, "finish_reason": "{finish_reason}", '
                   f'"matched_stop": null}}')
        return f'data: {self._head}, "choices": [{fin}], "usage": null}}\n\n'

    def usage_chunk(self, u: dict) -> str:
        return f'data: {self._head}, "choices": [], "usage": {json.dumps(u)}}}\n\n'

    @staticmethod
    def error_chunk(message: str, status: int = 500) -> str:
        return "data: " + json.dumps({"error": error_body(message, status=status)}) + "\n\n"

    # ---- non-streaming
    def full(self, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        req = self.req
        text = self.pieces.text(0, completion_tokens)
        reason = self.final_reason(completion_tokens)
        lp = None
        if req.logprobs:
            ps = self.pieces.pieces(0, completion_tokens)
            lp = (chat_logprobs(self.seed, 0, ps, req.top_logprobs) if req.api == "chat"
                  else completion_logprobs(self.seed, 0, ps, req.top_logprobs, len(req.echo_text)))
        u = usage(req.prompt_tokens, completion_tokens, cached_tokens)
        if req.api == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                              "tool_calls": None},
                      "logprobs": lp, "finish_reason": reason, "matched_stop": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": req.echo_text + text, "logprobs": lp, "finish_reason": reason,
                      "matched_stop": None}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": u}
