"""Owns reading request logs and token traces into normalized records (one reader module per format).

``open_log(path, fmt)`` detects the format (or takes it forced) and gives a ``LogSource``: its raw
lines stream from disk (plain or gzip) and ``parse_line`` turns one into a ``LogRecord`` or a
``Rejected`` (line number, reason, byte length). ``read_records`` chains both and, by default,
restores timestamp order within a bounded reorder window (``ReorderWindow``): records later than
the window are quarantined as out of order. ``TimelineGate`` (timeline.py), placed before the
window, quarantines timestamp outliers and keeps a pool's span and gaps within ``TimelineLimits``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

from autoresearch_dagster.logs.bulk import TraceChunk, parse_chunk
from autoresearch_dagster.logs.csv_traces import (AZURE_COLUMNS, BURSTGPT_COLUMNS, CsvHeader, parse_azure_line,
                                                  parse_burstgpt_line)
from autoresearch_dagster.logs.mooncake import MOONCAKE_BLOCK_TOKENS, parse_mooncake_line
from autoresearch_dagster.logs.openai_chat import parse_openai_line
from autoresearch_dagster.logs.records import LogRecord, RecordError, Rejected
from autoresearch_dagster.logs.source import (FORMATS, OversizedLine, ReorderWindow, detect_format,
                                              iter_line_batches, iter_lines, ordered)
from autoresearch_dagster.logs.timeline import TimelineGate, TimelineLimits
from autoresearch_dagster.spec import SpecError

__all__ = ["FORMATS", "LogRecord", "LogSource", "MOONCAKE_BLOCK_TOKENS", "RecordError", "Rejected",
           "ReorderWindow", "TimelineGate", "TimelineLimits", "TraceChunk", "detect_format", "open_log", "ordered",
           "parse_line", "read_records"]

_ALIASES = {"openai": "openai", "chat": "openai", "jsonl": "openai", "mooncake": "mooncake", "azure": "azure",
            "burstgpt": "burstgpt"}


def parse_line(parser: Callable[[bytes, int], LogRecord], line: int, raw: bytes) -> LogRecord | Rejected:
    if isinstance(raw, OversizedLine):
        return Rejected(line, "line longer than the 64 MiB limit", raw.size)
    try:
        return parser(raw, line)
    except RecordError as e:
        return Rejected(line, str(e), len(raw))
    except RecursionError:
        return Rejected(line, "JSON nested too deeply", len(raw))


@dataclass
class LogSource:
    path: Path
    format: str
    kind: str  # "chat" | "trace"
    parser: Callable[[bytes, int], LogRecord]  # picklable (module-level function or partial)
    skip_first: bool  # CSV header
    header: CsvHeader | None = None

    def lines(self) -> Iterator[tuple[int, bytes]]:
        for batch in self.line_batches():
            yield from batch

    def line_batches(self, max_lines: int = 4096) -> Iterator[list[tuple[int, bytes]]]:
        """Raw non-blank lines in batches, the CSV header left out."""
        first = self.skip_first
        for batch in iter_line_batches(self.path, max_lines):
            if first:
                batch, first = batch[1:], False
            if batch:
                yield batch

    def parse(self, line: int, raw: bytes) -> LogRecord | Rejected:
        return parse_line(self.parser, line, raw)

    def parse_bulk(self, batch: list[tuple[int, bytes]], block_tokens: int = MOONCAKE_BLOCK_TOKENS
                   ) -> tuple[TraceChunk | None, list[LogRecord | Rejected]]:
        """Trace formats: (columnar accepted rows or None, per-line results for the rest of the batch)."""
        res = None
        if self.kind == "trace" and not any(isinstance(raw, OversizedLine) for _, raw in batch):
            res = parse_chunk(self.format, batch, header_names=self.header.raw_names if self.header else None,
                              columns=self.header.columns if self.header else None, block_tokens=block_tokens)
        if res is None:
            return None, [self.parse(n, raw) for n, raw in batch]
        chunk, retry = res
        rest = [self.parse(n, raw) for n, raw in retry]
        if any(isinstance(r, LogRecord) for r in rest):  # readers disagree: the per-line reader decides all
            return None, [self.parse(n, raw) for n, raw in batch]
        return chunk, rest


def open_log(path: str | Path, fmt: str = "auto") -> LogSource:
    p = Path(path)
    if not p.exists():
        raise SpecError(f"log file {p} does not exist")
    if not p.is_file():
        raise SpecError(f"log file {p} is {'a directory' if p.is_dir() else 'not a regular file'}; give the log "
                        "files themselves")
    detected = detect_format(p)  # also raises on an empty file
    if fmt and fmt != "auto":
        if fmt not in _ALIASES:
            raise SpecError(f"unknown log format '{fmt}' (choose from auto, {', '.join(FORMATS)})")
        detected = _ALIASES[fmt]
    if detected == "openai":
        return LogSource(p, "openai", "chat", parse_openai_line, False)
    if detected == "mooncake":
        return LogSource(p, "mooncake", "trace", parse_mooncake_line, False)
    first = next(iter_lines(p))[1]
    columns = AZURE_COLUMNS if detected == "azure" else BURSTGPT_COLUMNS
    try:
        header = CsvHeader(first, columns)
    except RecordError as e:
        raise SpecError(f"{p}: not a {detected} CSV: {e}") from None
    fn = parse_azure_line if detected == "azure" else parse_burstgpt_line
    return LogSource(p, detected, "trace", partial(_csv_call, fn, header), True, header)


def _csv_call(fn, header: CsvHeader, raw: bytes, line: int) -> LogRecord:
    return fn(raw, line, header)


def read_records(path: str | Path, fmt: str = "auto", *, reorder: ReorderWindow | None = None,
                 keep_order: bool = True) -> Iterator[LogRecord | Rejected]:
    """Stream a log as records and rejections (file order, then timestamp order within the window)."""
    src = open_log(path, fmt)
    raw = (src.parse(n, line) for n, line in src.lines())
    return ordered(raw, reorder) if keep_order else raw
