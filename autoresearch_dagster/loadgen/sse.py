"""Owns server-sent-event parsing for OpenAI-style streaming responses.

``SSEDecoder`` turns arbitrary byte reads (events split at any byte, ``\\r\\n``/``\\r``/``\\n`` line
ends, ``:`` keep-alive comments, multi-line ``data:`` fields) into event payloads.
``StreamTracker`` interprets the payloads of one response: content chunks (chat ``delta.content``,
``reasoning_content`` or ``tool_calls``; completions ``text``) with their arrival times, usage in
the last chunk, ``[DONE]``, ``error`` objects mid-stream and malformed JSON, without raising.
"""
from __future__ import annotations

import json
from typing import Any


class SSEDecoder:
    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: bytes | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        """Bytes in, complete event payloads (the joined ``data`` fields) out."""
        buf = self._buf + chunk if self._buf else chunk
        hold = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # may be the first half of a \r\n split across reads
                buf, hold = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop() + hold
        events: list[bytes] = []
        for line in lines:
            self._line(line, events)
        return events

    def finish(self) -> list[bytes]:
        """Flush at end of stream: a last event without its terminating blank line still counts."""
        events: list[bytes] = []
        rest, self._buf = self._buf.rstrip(b"\r"), b""
        if rest:
            self._line(rest, events)
        if self._data is not None:
            events.append(self._data)
            self._data = None
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data is not None:
                events.append(self._data)
                self._data = None
            return
        if line[0] == 58:  # ':' keep-alive comment
            return
        if line.startswith(b"data:"):
            value = line[5:]
            if value[:1] == b" ":
                value = value[1:]
            if self._data is None:
                self._data = value
            elif value[:1] == b"{" or value == b"[DONE]":
                # Servers that separate events with a single newline: a new JSON object starts a new event.
                events.append(self._data)
                self._data = value
            else:
                self._data += b"\n" + value
        # other fields (event:, id:, retry:) carry nothing the runner needs


class StreamTracker:
    """Accumulates what one streamed response said, with the client time of each content chunk."""
    __slots__ = ("first_content_t", "last_content_t", "gaps", "n_content", "usage_tokens",
                 "cached_tokens", "error", "n_malformed", "done")

    def __init__(self) -> None:
        self.first_content_t: float | None = None
        self.last_content_t: float | None = None
        self.gaps: list[float] = []
        self.n_content = 0
        self.usage_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.error: str | None = None
        self.n_malformed = 0
        self.done = False

    def on_event(self, data: bytes, t: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        if data[-1:] == b"}" and b'"usage"' not in data and b'"error"' not in data:
            # Fast path for the common chunk (a non-empty "content" string, nothing else to read):
            # decoding JSON for each of thousands of chunks per second is most of the client's CPU.
            i = data.find(b'"content":"')
            k = i + 11
            if i < 0:
                i = data.find(b'"content": "')
                k = i + 12
            if i >= 0 and data[k:k + 1] != b'"':
                self._content(t)
                return
        try:
            obj = json.loads(data)
        except ValueError:
            self.n_malformed += 1
            return
        if not isinstance(obj, dict):
            self.n_malformed += 1
            return
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message") if isinstance(err, dict) else err
            self.error = str(msg or "error")[:200]
            return
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.cached_tokens = details["cached_tokens"]
        choices = obj.get("choices")
        if choices and _has_content(choices):
            self._content(t)

    def _content(self, t: float) -> None:
        if self.first_content_t is None:
            self.first_content_t = t
        else:
            self.gaps.append(t - self.last_content_t)
        self.last_content_t = t
        self.n_content += 1


def _has_content(choices: Any) -> bool:
    if not isinstance(choices, list):
        return False
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        if isinstance(delta, dict):
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                return True
        elif ch.get("text"):
            return True
    return False
