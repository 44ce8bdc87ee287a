"""Owns the CSV token-trace readers: Azure-style (TIMESTAMP, ContextTokens, GeneratedTokens) and BurstGPT-style."""
from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone

from autoresearch_dagster.logs.records import LogRecord, RecordError, check_timestamp, check_tokens


def split_csv(text: str) -> list[str]:
    if '"' not in text:
        return text.split(",")
    return next(csv.reader([text]))


class CsvHeader:
    """Column positions from a header line; names matched case- and space-insensitively."""

    def __init__(self, raw: bytes, required: dict[str, str]):
        try:
            text = raw.decode("utf-8").lstrip("\ufeff")
        except UnicodeDecodeError:
            raise RecordError("header is not valid UTF-8") from None
        self.raw_names = [c.strip() for c in split_csv(text)]
        names = [c.lower().replace(" ", "") for c in self.raw_names]
        self.pos: dict[str, int] = {}
        for field, col in required.items():
            key = col.lower().replace(" ", "")
            if key not in names:
                raise RecordError(f"header lacks column '{col}'")
            self.pos[field] = names.index(key)
        self.n = len(names)
        self.columns = {field: self.raw_names[i] for field, i in self.pos.items()}  # field -> name as written


def _cells(raw: bytes, header: CsvHeader) -> list[str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"invalid UTF-8 at byte {e.start}") from None
    cells = split_csv(text)
    if len(cells) != header.n:
        raise RecordError(f"expected {header.n} columns, got {len(cells)}")
    return cells


def _int(cell: str, name: str, allow_zero: bool) -> int:
    try:
        value = int(cell)
    except ValueError:
        try:
            value = float(cell)
        except ValueError:
            raise RecordError(f"column '{name}' is not a number") from None
    return check_tokens(name, value, allow_zero=allow_zero)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)

AZURE_COLUMNS = {"ts": "TIMESTAMP", "in": "ContextTokens", "out": "GeneratedTokens"}
BURSTGPT_COLUMNS = {"ts": "Timestamp", "model": "Model", "in": "Request tokens", "out": "Response tokens",
                    "log_type": "Log Type"}


def parse_azure_line(raw: bytes, line: int, header: CsvHeader) -> LogRecord:
    cells = _cells(raw, header)
    ts_cell = cells[header.pos["ts"]].strip()
    try:
        dt = datetime.fromisoformat(ts_cell)
    except ValueError:
        raise RecordError("column 'TIMESTAMP' is not a date-time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    ts = ((dt - _EPOCH) // _US) / 1e6  # integer microseconds, as the bulk reader computes them
    return LogRecord(line=line, timestamp_s=check_timestamp(ts), kind="trace", nbytes=len(raw),
                     input_length=_int(cells[header.pos["in"]], "ContextTokens", False),
                     output_length=_int(cells[header.pos["out"]], "GeneratedTokens", False))


def parse_burstgpt_line(raw: bytes, line: int, header: CsvHeader) -> LogRecord:
    cells = _cells(raw, header)
    try:
        ts = float(cells[header.pos["ts"]])
    except ValueError:
        raise RecordError("column 'Timestamp' is not a number of seconds") from None
    # BurstGPT logs failed requests with 0 response tokens; they cannot be replayed with a pinned length.
    return LogRecord(line=line, timestamp_s=check_timestamp(ts), kind="trace", nbytes=len(raw),
                     input_length=_int(cells[header.pos["in"]], "Request tokens", False),
                     output_length=_int(cells[header.pos["out"]], "Response tokens", False))
