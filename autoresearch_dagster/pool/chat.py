"""Owns the per-record work of a chat-log pool build: parse, redact, count, hash -> a pool row.

Kept apart from ``pool_build`` so worker processes import only what this needs (no scipy).
Everything here happens in memory; the row it returns holds only redacted content.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from collections import Counter
from typing import Any, Callable

from autoresearch_dagster import tokens
from autoresearch_dagster.logs import LogRecord, Rejected, parse_line
from autoresearch_dagster.pool.schema import request_to_row, split_for, PoolRequest
from autoresearch_dagster.pool.redact import Redactor, load_models
from autoresearch_dagster.tokens import APPROX_NAME, block_hashes, get_counter, render_prompt

CHAT_BLOCK_TOKENS = 64
DEFAULT_OUTPUT_TOKENS = 256  # only when a log has neither usage nor max_tokens (recorded as "estimate")


def count_and_hashes(text: str, counter: Callable[[str], int] | None, block_tokens: int = CHAT_BLOCK_TOKENS
                     ) -> tuple[int, list[int]]:
    """(token count, ``tokens.block_hashes(text, block_tokens)``) with one tokenization pass for the approx counter."""
    if counter is not None:
        return counter(text), block_hashes(text, block_tokens)
    pieces = tokens._PIECE.findall(text)  # the same split block_hashes uses (a test pins the equality)
    out: list[int] = []
    h = hashlib.blake2b(digest_size=8)
    for i in range(len(pieces) // block_tokens):
        h.update("".join(pieces[i * block_tokens:(i + 1) * block_tokens]).encode())
        out.append(int.from_bytes(h.copy().digest(), "big") >> 1)
    return len(pieces), out


def _content_key(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True, ensure_ascii=False)


def conversation_key(rec: LogRecord, key: bytes, redacted_messages: list[dict] | None) -> str:
    # Logged ids may be personal (an e-mail as a session id): only a keyed hash of them is kept.
    if rec.conversation_id is not None:
        basis = "id:" + rec.conversation_id
    else:  # inferred: same system prompt + first user message => same conversation
        msgs = redacted_messages or []
        lead = [m for m in msgs if m.get("role") in ("system", "developer")][:1] + \
               [m for m in msgs if m.get("role") == "user"][:1]
        basis = ("msg:" + "\x1d".join(f"{m.get('role')}\x1e{_content_key(m.get('content'))}" for m in lead)
                 if lead else "prompt:" + (rec.prompt or ""))
    return "c-" + hmac.new(key, basis.encode(), hashlib.sha256).hexdigest()[:16]


def process_chat_record(rec: LogRecord, redactor: Redactor, counter: Callable[[str], int] | None,
                        key: bytes) -> tuple[PoolRequest, dict]:
    """Redact one record and derive its pool request; ``counter`` None means the approx counter.

    Also returns the source-side statistics computed on the text before redaction, and what the log
    says production reported (usage prompt and cached tokens).
    """
    orig_text = render_prompt(rec.messages, rec.tools, rec.prompt)
    messages = redactor.redact_messages(rec.messages) if rec.messages is not None else None
    prompt = redactor.redact_text(rec.prompt) if rec.prompt is not None else None
    tools = redactor.redact_json(rec.tools) if rec.tools is not None else None
    response_format = redactor.redact_json(rec.response_format) if rec.response_format is not None else None
    tool_choice = redactor.redact_json(rec.tool_choice) if rec.tool_choice is not None else None
    new_text = render_prompt(messages, tools, prompt)
    n_tokens, hashes = count_and_hashes(new_text, counter)
    if new_text == orig_text:
        src_tokens, src_hashes = n_tokens, hashes
    else:
        src_tokens, src_hashes = count_and_hashes(orig_text, counter)
    if rec.usage_completion_tokens is not None:
        out, out_src = rec.usage_completion_tokens, "usage"
    elif rec.sampling.get("max_completion_tokens") or rec.sampling.get("max_tokens"):
        out, out_src = rec.sampling.get("max_completion_tokens") or rec.sampling["max_tokens"], "max_tokens"
    else:
        out, out_src = DEFAULT_OUTPUT_TOKENS, "estimate"
    conv = conversation_key(rec, key, messages)
    turn = sum(1 for m in messages if m.get("role") == "user") if messages is not None else None
    # logged ids can carry anything (user names, e-mails); a keyed hash keeps them distinct and opaque
    rid = "r-" + hmac.new(key, b"rid:" + rec.request_id.encode(), hashlib.sha256).hexdigest()[:16] \
        if rec.request_id else f"line-{rec.line}"
    req = PoolRequest(
        id=rid, arrival_s=rec.timestamp_s, conversation_id=conv, turn=turn, api=rec.api,
        messages=messages, prompt=prompt, tools=tools, tool_choice=tool_choice, response_format=response_format,
        sampling=rec.sampling, prompt_tokens=n_tokens, output_tokens=out, block_hashes=hashes,
        block_tokens=CHAT_BLOCK_TOKENS, split=split_for(conv), output_tokens_source=out_src,
        source_latency_s=rec.latency_s)
    # source hashes travel only when redaction changed them (most requests: same list as the row's)
    return req, {"prompt_tokens": src_tokens, "hashes": None if src_hashes is hashes else src_hashes,
                 "line": rec.line, "nbytes": rec.nbytes, "usage_prompt_tokens": rec.usage_prompt_tokens,
                 "cached_tokens": rec.cached_tokens}


_worker: dict[str, Any] = {}


def init_worker(key: bytes, tokenizer_path: str | None) -> None:
    name, fn = get_counter(tokenizer_path)
    exact = None if name == APPROX_NAME else fn
    # class-preserving surrogates keep the approx count already; an exact tokenizer gets matched candidates
    _worker["redactor"] = Redactor(key, counter=exact)
    _worker["counter"] = exact
    _worker["key"] = key
    load_models()


def process_chat_batch(parser, batch: list[tuple[int, bytes]]) -> tuple[list, dict]:
    """Rejections and (row, source stats) pairs for one batch of raw lines, plus the redaction counts it added."""
    redactor: Redactor = _worker["redactor"]
    before = Counter(redactor.counts)
    out: list = []
    for line, raw in batch:
        rec = parse_line(parser, line, raw)
        if isinstance(rec, Rejected):
            out.append(rec)
        else:
            req, src = process_chat_record(rec, redactor, _worker["counter"], _worker["key"])
            out.append((request_to_row(req), src))
    delta = Counter(redactor.counts)
    delta.subtract(before)
    return out, {k: v for k, v in delta.items() if v}
