"""Owns the failure classes of requests an engine refused or could not serve, and their tally per step.

A real engine's refusals are evidence about the endpoint, not noise: an HTTP error's body says why
(vLLM and SGLang answer OpenAI-style ``{"error": {"message": ...}}``, FastAPI ``{"detail": ...}``).
``classify_http_error`` turns status + body into one ``RequestRecord.error_class``:

- ``context_too_long``: the prompt (plus max_tokens) exceeds the served max-model-len;
- ``unsupported_feature``: the request asks for something the server was not started for
  (tools with ``tool_choice: auto`` but no tool parser, a response format it cannot honour, ...);
- otherwise ``http_429`` / ``http_5xx`` / ``http_4xx`` as before.

``ENGINE_CRASH`` is set by an engine that saw its server process die during a step (the records
that failed on the dead server are re-labelled, with the log excerpt kept in the step's metadata).
``tally`` summarises a step's failures: count per class and the first message of each.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

CONTEXT_TOO_LONG = "context_too_long"
UNSUPPORTED_FEATURE = "unsupported_feature"
ENGINE_CRASH = "engine_crash"

_CONTEXT = re.compile(r"maximum context length|max_model_len|max-model-len|context length|"
                      r"longer than the maximum model length|too many tokens|prompt is too long", re.I)
_UNSUPPORTED = re.compile(r"tool choice requires|enable-auto-tool-choice|tool-call-parser|tool_call_parser|"
                          r"not supported|unsupported|does not support", re.I)
MESSAGE_CHARS = 300


def error_message(body: bytes | str) -> str:
    """The human-readable message of an error body (OpenAI, SGLang or FastAPI shape), else its text."""
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else str(body)
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:MESSAGE_CHARS]
    msg: Any = obj
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        msg = (err.get("message") or err.get("detail") or err) if isinstance(err, dict) else err
        if msg is obj and "detail" in obj:
            msg = obj["detail"]
    return (msg if isinstance(msg, str) else json.dumps(msg))[:MESSAGE_CHARS]


def classify_http_error(status: int, body: bytes | str) -> tuple[str, str]:
    """(error_class, message) for a non-200 answer."""
    msg = error_message(body)
    if status == 429:
        return "http_429", msg
    if status >= 500:
        return "http_5xx", msg
    if _CONTEXT.search(msg):
        return CONTEXT_TOO_LONG, msg
    if _UNSUPPORTED.search(msg):
        return UNSUPPORTED_FEATURE, msg
    return "http_4xx", msg


def tally(records: Iterable[Any], messages: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``{error_class: {"count": n, "message": first message seen}}`` over the failed records."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.status == "ok":
            continue
        cls = r.error_class or r.status
        entry = out.setdefault(cls, {"count": 0, "message": (messages or {}).get(cls)})
        entry["count"] += 1
    return dict(sorted(out.items()))
