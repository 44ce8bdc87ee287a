"""Owns the OpenAI chat-completions request-log reader (JSONL; nested or flattened request/response).

Accepted shape (one JSON object per line; see docs/pool.md for the full definition):
  timestamp   ``timestamp`` | ``ts`` | ``time`` | ``created_at`` | ``request_time`` | ``start_time`` |
              ``created``: epoch seconds (ms / us auto-scaled by magnitude) or an ISO-8601 string
  request     nested under ``request`` | ``body`` | ``request_body`` (an object or a JSON string), or
              flattened at the top level: ``messages`` (chat) or ``prompt`` (completions), ``tools``,
              ``tool_choice``, ``response_format``, sampling parameters
  response    optional, nested under ``response`` | ``response_body`` or flattened: ``usage``
              {prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens}
  timings     optional: ``timings`` {ttft_ms, latency_ms | e2e_ms | duration_ms} or top-level
              ``ttft_ms`` / ``latency_ms`` / ``duration_ms`` / ``latency_s``, or ``end_time``
  ids         optional ``request_id`` | ``id``; ``conversation_id`` | ``session_id`` | ``thread_id``
              (also inside ``metadata``)
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from autoresearch_dagster.logs.records import LogRecord, RecordError, check_timestamp, check_tokens, load_json_line

_TS_KEYS = ("timestamp", "ts", "time", "created_at", "request_time", "start_time", "created")
_REQ_KEYS = ("request", "body", "request_body")
_RESP_KEYS = ("response", "response_body")
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_NUMBER_PARAMS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
_INT_PARAMS = ("top_k", "n", "seed", "top_logprobs")
_TOKEN_PARAMS = ("max_tokens", "max_completion_tokens")


def parse_time(value: Any, name: str = "timestamp") -> float:
    if isinstance(value, bool):
        raise RecordError(f"field '{name}' has wrong type bool")
    if isinstance(value, (int, float)):
        v = float(value)
        if v > 1e17:
            v /= 1e9
        elif v > 1e14:
            v /= 1e6
        elif v > 1e11:
            v /= 1e3
        return check_timestamp(v)
    if isinstance(value, str):
        s = value.strip()
        try:
            return check_timestamp(float(s))
        except ValueError:
            pass
        try:
            dt = datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s)
        except ValueError:
            raise RecordError(f"field '{name}' is not a number or an ISO-8601 time") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return check_timestamp(dt.timestamp())
    raise RecordError(f"field '{name}' has wrong type {type(value).__name__}")


def _get(d: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if k in d and d[k] is not None:
            return k, d[k]
    return None, None


def _obj(value: Any, name: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise RecordError(f"field '{name}' is a string but not valid JSON") from None
    if not isinstance(value, dict):
        raise RecordError(f"field '{name}' must be an object, got {type(value).__name__}")
    return value


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list):
        raise RecordError(f"field 'messages' must be a list, got {type(messages).__name__}")
    if not messages:
        raise RecordError("field 'messages' is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RecordError(f"messages[{i}] must be an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise RecordError(f"messages[{i}].role is missing or not one of {sorted(_ROLES)}")
        content = m.get("content")
        if content is None:
            if role in ("user", "system", "developer") :
                raise RecordError(f"messages[{i}].content is missing for role {role}")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise RecordError(f"messages[{i}].content[{j}] must be an object with a 'type'")
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise RecordError(f"messages[{i}].content[{j}].text must be a string")
        elif not isinstance(content, str):
            raise RecordError(f"messages[{i}].content must be a string, a list of parts or null, "
                              f"got {type(content).__name__}")
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise RecordError(f"messages[{i}].tool_calls must be a list")
    return messages


def _sampling(req: dict) -> dict:
    out: dict[str, Any] = {}
    for k in _NUMBER_PARAMS:
        v = req.get(k)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise RecordError(f"field '{k}' must be a number, got {type(v).__name__}")
            out[k] = v
    for k in _INT_PARAMS:
        v = req.get(k)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int):
                raise RecordError(f"field '{k}' must be an integer, got {type(v).__name__}")
            out[k] = v
    for k in _TOKEN_PARAMS:
        if req.get(k) is not None:
            out[k] = check_tokens(k, req[k], allow_zero=False)
    stop = req.get("stop")
    if stop is not None:
        if not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
            raise RecordError("field 'stop' must be a string or a list of strings")
        out["stop"] = stop
    for k in ("logprobs", "stream", "ignore_eos"):
        v = req.get(k)
        if v is not None:
            if not isinstance(v, bool):
                raise RecordError(f"field '{k}' must be a boolean, got {type(v).__name__}")
            out[k] = v
    if isinstance(req.get("logit_bias"), dict):
        out["logit_bias"] = req["logit_bias"]
    return out


def _opt_ms(d: dict, keys: tuple[str, ...], scale: float) -> float | None:
    k, v = _get(d, keys)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
        raise RecordError(f"timing '{k}' must be a non-negative number")
    return float(v) * scale


def parse_openai_obj(obj: Any, line: int, nbytes: int) -> LogRecord:
    if not isinstance(obj, dict):
        raise RecordError(f"record must be a JSON object, got {type(obj).__name__}")
    ts_key, ts_val = _get(obj, _TS_KEYS)
    req_key, req = _get(obj, _REQ_KEYS)
    req = _obj(req, req_key) if req_key else obj
    if ts_key is None:
        ts_key, ts_val = _get(req, _TS_KEYS)
    if ts_key is None:
        raise RecordError(f"missing timestamp (one of {', '.join(_TS_KEYS)})")
    ts = parse_time(ts_val, ts_key)

    messages = req.get("messages")
    prompt = req.get("prompt")
    if messages is not None:
        api = "chat"
        messages = _check_messages(messages)
    elif prompt is not None:
        api = "completions"
        if not isinstance(prompt, str):
            raise RecordError(f"field 'prompt' must be a string, got {type(prompt).__name__}")
    else:
        raise RecordError("missing 'messages' (chat) or 'prompt' (completions) in the request")
    if "model" in req and not isinstance(req["model"], str):
        raise RecordError(f"field 'model' must be a string, got {type(req['model']).__name__}")
    tools = req.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RecordError("field 'tools' must be a list of objects")
    response_format = req.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise RecordError("field 'response_format' must be an object")
    tool_choice = req.get("tool_choice")
    if tool_choice is not None and not isinstance(tool_choice, (str, dict)):
        raise RecordError("field 'tool_choice' must be a string or an object")
    sampling = _sampling(req)

    resp_key, resp = _get(obj, _RESP_KEYS)
    resp = _obj(resp, resp_key) if resp_key else {}
    usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else obj.get("usage")
    up = uc = cached = None
    if usage is not None:
        if not isinstance(usage, dict):
            raise RecordError("field 'usage' must be an object")
        if usage.get("prompt_tokens") is not None:
            up = check_tokens("usage.prompt_tokens", usage["prompt_tokens"])
        if usage.get("completion_tokens") is not None:
            uc = check_tokens("usage.completion_tokens", usage["completion_tokens"])
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            cached = check_tokens("usage.prompt_tokens_details.cached_tokens", details["cached_tokens"])

    timings = obj.get("timings") if isinstance(obj.get("timings"), dict) else obj
    ttft = _opt_ms(timings, ("ttft_ms",), 1e-3)
    latency = _opt_ms(timings, ("latency_ms", "e2e_ms", "duration_ms"), 1e-3)
    if latency is None:
        latency = _opt_ms(timings, ("latency_s", "duration_s"), 1.0)
    if latency is None and obj.get("end_time") is not None:
        latency = parse_time(obj["end_time"], "end_time") - ts
        if latency < 0:
            raise RecordError("end_time is before the request timestamp")

    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    _, conv = _get(obj, ("conversation_id", "session_id", "thread_id"))
    if conv is None:
        _, conv = _get(meta, ("conversation_id", "session_id", "thread_id"))
    _, rid = _get(obj, ("request_id", "id"))
    if rid is None:
        rid = resp.get("id")
    return LogRecord(
        line=line, timestamp_s=ts, kind="chat", nbytes=nbytes,
        request_id=None if rid is None else str(rid), conversation_id=None if conv is None else str(conv),
        api=api, messages=messages, prompt=prompt if api == "completions" else None, tools=tools,
        tool_choice=tool_choice, response_format=response_format, sampling=sampling,
        usage_prompt_tokens=up, usage_completion_tokens=uc, cached_tokens=cached, ttft_s=ttft, latency_s=latency,
    )


def parse_openai_line(raw: bytes, line: int) -> LogRecord:
    obj = load_json_line(raw)
    return parse_openai_obj(obj, line, len(raw))
