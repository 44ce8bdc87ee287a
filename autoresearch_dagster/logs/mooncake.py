"""Owns the Mooncake-style token-trace reader: JSONL with timestamp (ms), input_length, output_length, hash_ids."""
from __future__ import annotations

from autoresearch_dagster.logs.records import LogRecord, RecordError, check_timestamp, check_tokens, load_json_line

MOONCAKE_BLOCK_TOKENS = 512


def parse_mooncake_line(raw: bytes, line: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> LogRecord:
    obj = load_json_line(raw)
    if not isinstance(obj, dict):
        raise RecordError(f"record must be a JSON object, got {type(obj).__name__}")
    for k in ("timestamp", "input_length", "output_length", "hash_ids"):
        if k not in obj:  # without hash_ids the pool would lose the trace's prefix sharing, silently
            raise RecordError(f"missing field '{k}'")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise RecordError(f"field 'timestamp' must be a number of milliseconds, got {type(ts).__name__}")
    n_in = check_tokens("input_length", obj["input_length"], allow_zero=False)
    n_out = check_tokens("output_length", obj["output_length"], allow_zero=False)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**63
                                            for h in ids):
        raise RecordError("field 'hash_ids' must be a list of non-negative integers")
    if len(ids) > -(-n_in // block_tokens):
        raise RecordError(f"hash_ids lists {len(ids)} blocks but input_length {n_in} fills at most "
                          f"{-(-n_in // block_tokens)} blocks of {block_tokens} tokens")
    return LogRecord(line=line, timestamp_s=check_timestamp(ts / 1000.0), kind="trace", nbytes=len(raw),
                     input_length=n_in, output_length=n_out, hash_ids=ids,
                     conversation_id=None if obj.get("session_id") is None else str(obj["session_id"]))
