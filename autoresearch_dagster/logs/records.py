"""Owns the normalized log record every reader yields, the rejection record, and the sanity limits."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

# Token counts beyond this are treated as corrupt (no served context or output is this long).
MAX_TOKENS = 2**21
# A single logged request larger than this is quarantined rather than parsed (bounded memory).
MAX_LINE_BYTES = 64 * 2**20


class RecordError(ValueError):
    """A record that cannot be accepted; the message is the quarantine reason (never holds values)."""


def load_json_line(raw: bytes) -> object:
    """One JSONL record decoded, or RecordError naming the bad byte / column."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RecordError(f"invalid UTF-8 at byte {e.start}") from None
    except ValueError as e:
        raise RecordError(f"malformed JSON: {e.msg} at column {getattr(e, 'colno', '?')}") from None


@dataclass
class LogRecord:
    line: int
    timestamp_s: float  # absolute seconds (epoch or trace-relative), as read
    kind: Literal["chat", "trace"]
    nbytes: int = 0
    request_id: str | None = None
    conversation_id: str | None = None
    # chat logs
    api: Literal["chat", "completions"] = "chat"
    messages: list[dict] | None = None
    prompt: str | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    response_format: dict | None = None
    sampling: dict = field(default_factory=dict)
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    # token-count traces
    input_length: int | None = None
    output_length: int | None = None
    hash_ids: list[int] | None = None


@dataclass
class Rejected:
    line: int
    reason: str
    nbytes: int

    def to_json(self) -> dict:
        # Only position, size and reason: the line's content never reaches the quarantine file.
        return {"line": self.line, "reason": self.reason, "bytes": self.nbytes}


def check_tokens(name: str, value: Any, *, allow_zero: bool = True) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise RecordError(f"field '{name}' must be an integer token count, got {type(value).__name__}")
    if isinstance(value, float):
        if not value.is_integer():
            raise RecordError(f"field '{name}' must be an integer token count, got a fraction")
        value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise RecordError(f"field '{name}' must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    if value > MAX_TOKENS:
        raise RecordError(f"field '{name}' is an absurd token count ({value} > {MAX_TOKENS})")
    return value


def check_timestamp(value: float) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise RecordError("timestamp is not a finite number")
    if value < 0:
        raise RecordError("negative timestamp")
    return value
