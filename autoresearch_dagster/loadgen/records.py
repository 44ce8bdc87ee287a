"""Owns the measurement record types shared by every engine and the runner.

A load step is a schedule of ``ScheduledRequest``s (intended send offsets + the OpenAI request
body + the token-level hints the pool knows). Whatever executes it, the HTTP runner against a
real or emulated server, or the emulator's in-process virtual-time engine, returns one
``RequestRecord`` per scheduled request in a ``StepOutcome``. All statistics (load curves,
capacity, verdicts, diagnosis) are computed from these records only: one measurement path.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pyarrow as pa

Status = Literal["ok", "error", "timeout"]


@dataclass
class ScheduledRequest:
    request_id: str
    send_offset_s: float  # intended send time relative to the step start
    api: Literal["chat", "completions"]
    body: dict[str, Any]  # the OpenAI-compatible request body, stream forced on by the runner
    prompt_tokens: int  # from the pool's token counter
    output_tokens: int  # expected output length (pinned with max_tokens / ignore_eos)
    block_hashes: list[int] = field(default_factory=list)  # prefix block hashes (prefix structure)
    block_tokens: int = 64  # tokens covered by each block hash
    pool_row: int | None = None


@dataclass
class RequestRecord:
    request_id: str
    step_id: str
    scheduled_s: float  # intended send offset from step start
    sent_s: float  # actual send offset from step start (send lag = sent_s - scheduled_s)
    first_token_s: float | None  # offset of first content token
    end_s: float | None  # offset of completion / failure
    ttft_s: float | None
    itl_s: list[float]  # every inter-chunk gap after the first token
    e2e_s: float | None
    prompt_tokens: int
    output_tokens: int  # usage when the server gave it, else counted
    status: Status
    http_status: int | None = None
    error_class: str | None = None  # e.g. "connect", "http_5xx", "http_429", "stream_malformed", "timeout"
    bytes_received: int = 0
    cached_tokens: int | None = None

    @property
    def send_lag_s(self) -> float:
        return self.sent_s - self.scheduled_s

    @property
    def tpot_s(self) -> float | None:
        if self.status != "ok" or self.e2e_s is None or self.ttft_s is None or self.output_tokens <= 1:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


RECORD_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("step_id", pa.string()), ("scheduled_s", pa.float64()),
    ("sent_s", pa.float64()), ("first_token_s", pa.float64()), ("end_s", pa.float64()),
    ("ttft_s", pa.float64()), ("itl_s", pa.list_(pa.float32())), ("e2e_s", pa.float64()),
    ("prompt_tokens", pa.int32()), ("output_tokens", pa.int32()), ("status", pa.string()),
    ("http_status", pa.int32()), ("error_class", pa.string()), ("bytes_received", pa.int64()),
    ("cached_tokens", pa.int32()),
])


def records_to_table(records: list[RequestRecord]) -> pa.Table:
    return pa.Table.from_pylist([asdict(r) for r in records], schema=RECORD_SCHEMA)


@dataclass
class StepOutcome:
    """What executing one schedule produced."""
    step_id: str
    records: list[RequestRecord]
    duration_s: float  # wall (or virtual) time from step start until the last request ended
    client_invalid_reasons: list[str] = field(default_factory=list)  # runner self-checks (send lag, CPU)
    engine_timeseries: list[dict[str, Any]] = field(default_factory=list)  # scraped/emitted engine metrics
    meta: dict[str, Any] = field(default_factory=dict)
