"""Owns reading log files: streaming raw lines (plain or gzip), format detection, the reorder window."""
from __future__ import annotations

import gzip
import heapq
from pathlib import Path
from typing import IO, Iterable, Iterator

from autoresearch_dagster.logs.records import MAX_LINE_BYTES, LogRecord, Rejected
from autoresearch_dagster.spec import SpecError

FORMATS = ("openai", "mooncake", "azure", "burstgpt")


def _open(path: Path) -> IO[bytes]:
    raw = open(path, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw)
    raw.seek(0)
    return raw


def iter_line_batches(path: str | Path, max_lines: int = 4096, block_bytes: int = 1 << 22
                      ) -> Iterator[list[tuple[int, bytes]]]:
    """Batches of (1-based line number, raw bytes without the line end) of the non-blank lines, streamed.

    The file is read in blocks (memory: one block plus one pending line). A line longer than
    MAX_LINE_BYTES is skipped through and stands as an ``OversizedLine`` carrying only its size,
    so the caller can quarantine it without ever holding it whole.
    """
    with _open(Path(path)) as f:
        n, rest, batch = 0, b"", []
        skipping = -1  # >= 0 while inside an oversized line: bytes seen so far
        while True:
            data = f.read(block_bytes)
            if not data:
                break
            if skipping >= 0:
                nl = data.find(b"\n")
                if nl < 0:
                    skipping += len(data)
                    continue
                n += 1
                batch.append((n, OversizedLine(skipping + nl)))
                skipping, data = -1, data[nl + 1:]
            buf = rest + data if rest else data
            lines = buf.split(b"\n")
            rest = lines.pop()
            if len(rest) > MAX_LINE_BYTES:
                skipping, rest = len(rest), b""
            for ln in lines:
                n += 1
                if len(ln) > MAX_LINE_BYTES:
                    batch.append((n, OversizedLine(len(ln))))
                elif ln and not ln.isspace():
                    batch.append((n, ln.rstrip(b"\r")))
                if len(batch) >= max_lines:
                    yield batch
                    batch = []
        if skipping >= 0:
            batch.append((n + 1, OversizedLine(skipping)))
        elif rest and not rest.isspace():
            batch.append((n + 1, rest.rstrip(b"\r")))
        if batch:
            yield batch


def iter_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) for every non-blank line, streamed (see ``iter_line_batches``)."""
    for batch in iter_line_batches(path):
        yield from batch


class OversizedLine(bytes):
    """Stands in for a line over MAX_LINE_BYTES; carries only its size."""

    def __new__(cls, size: int):
        obj = super().__new__(cls, b"")
        obj.size = size
        return obj


def detect_format(path: str | Path, probe_lines: int = 50) -> str:
    """Guess the format from the first records (malformed ones skipped); SpecError if empty or unknown."""
    p = Path(path)
    if not p.exists():
        raise SpecError(f"log file {p} does not exist")
    seen = 0
    for _, line in iter_lines(p):
        seen += 1
        if seen > probe_lines:
            break
        head = line[:65536].decode("utf-8", errors="replace").strip().lstrip("\ufeff")
        low = head.lower()
        if head.startswith("{"):
            if '"hash_ids"' in head or '"input_length"' in head:
                return "mooncake"
            if any(k in head for k in ('"messages"', '"request"', '"body"', '"prompt"', '"request_body"')):
                return "openai"
            continue
        if "contexttokens" in low and "generatedtokens" in low:
            return "azure"
        if "request tokens" in low and "response tokens" in low:
            return "burstgpt"
        if seen == 1 and not head.startswith(("{", "[")):
            break  # neither JSON nor a known CSV header
    if seen == 0:
        raise SpecError(f"log file {p} is empty (no records)")
    raise SpecError(f"cannot detect the format of {p}: its first records are neither OpenAI chat JSON "
                    "('messages'/'request'/'body'), Mooncake JSON ('hash_ids'/'input_length') nor a known CSV "
                    "header (Azure: TIMESTAMP,ContextTokens,GeneratedTokens; BurstGPT: Timestamp,Model,Request "
                    "tokens,...); use --format to force one")


class ReorderWindow:
    """Restores timestamp order within a bounded window; records later than that are quarantined.

    A record is held until it is more than ``window_s`` older than the newest timestamp seen or
    more than ``max_held`` records are held; records are released in timestamp order. A record
    whose timestamp is earlier than one already released arrived too late to be placed and is
    rejected as out of order (memory stays bounded by ``max_held``).
    """

    def __init__(self, window_s: float = 60.0, max_held: int = 20000):
        self.window_s = window_s
        self.max_held = max_held
        self._heap: list[tuple[float, int, object]] = []
        self._newest = float("-inf")
        self._released = float("-inf")
        self._seq = 0

    def push(self, ts: float, line: int, nbytes: int, item: object) -> Iterator[object]:
        if ts < self._released:
            yield Rejected(line, f"timestamp out of order: {self._released - ts:.3f} s earlier than records "
                                 f"already released (reorder window {self.window_s:g} s / {self.max_held} records)",
                           nbytes)
            return
        self._seq += 1
        heapq.heappush(self._heap, (ts, self._seq, item))
        self._newest = max(self._newest, ts)
        while self._heap and (len(self._heap) > self.max_held or self._heap[0][0] < self._newest - self.window_s):
            yield self._pop()

    def _pop(self) -> object:
        ts, _, item = heapq.heappop(self._heap)
        self._released = ts
        return item

    def drain(self) -> Iterator[object]:
        while self._heap:
            yield self._pop()


def ordered(records: Iterable[LogRecord | Rejected], window: ReorderWindow | None = None) -> Iterator[LogRecord | Rejected]:
    """Pass rejections through, and records in timestamp order via the reorder window."""
    window = window or ReorderWindow()
    for r in records:
        if isinstance(r, Rejected):
            yield r
        else:
            yield from window.push(r.timestamp_s, r.line, r.nbytes, r)
    yield from window.drain()
