"""Owns what production did, per request, as numbers: the ``Timeline`` of a log or of a replay.

A ``Timeline`` holds, per request: start and end (seconds; end NaN when unknown), prompt, output and
cached-prompt tokens (-1 when unknown). Production's is collected from the source log while the
pool is built (``ProductionLog``), one row per accepted request in arrival order (both splits:
production served them all), and kept beside the pool as ``production.parquet``: numbers only,
never content. Its prompt tokens are
the log's ``usage.prompt_tokens`` (the production tokenizer, before redaction), or the pool's count
of the original text when the log has no usage; cached tokens are the log's
``usage.prompt_tokens_details.cached_tokens``; ends are start + the logged latency. A replay's
timeline comes from the runner's ``RequestRecord``s (``replay_timeline``): sent and end offsets,
the prompt tokens it sent (the pool's counts after redaction), the output of completed requests and
the cached tokens the engine reported.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from autoresearch_dagster.loadgen.records import RequestRecord

PRODUCTION_FILE = "production.parquet"
_SCHEMA = pa.schema([("start_s", pa.float64()), ("end_s", pa.float64()), ("prompt_tokens", pa.int64()),
                     ("output_tokens", pa.int64()), ("cached_tokens", pa.int64())])


@dataclass(frozen=True)
class Timeline:
    start_s: np.ndarray
    end_s: np.ndarray  # NaN: unknown (no latency logged, a replayed request that never ended)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray  # -1: unknown (a replayed request that failed)
    cached_tokens: np.ndarray  # -1: unknown (not logged, not reported by the engine)

    def __len__(self) -> int:
        return len(self.start_s)


def _timeline(start: Iterable[float], end: Iterable[float], prompt: Iterable[int], output: Iterable[int],
              cached: Iterable[int]) -> Timeline:
    return Timeline(np.asarray(start, np.float64), np.asarray(end, np.float64), np.asarray(prompt, np.int64),
                    np.asarray(output, np.int64), np.asarray(cached, np.int64))


class ProductionLog:
    """Collects production's timeline during a pool build (five numbers per request)."""

    def __init__(self) -> None:
        self.start, self.end = array("d"), array("d")
        self.prompt, self.output, self.cached = array("q"), array("q"), array("q")

    def add(self, start_s: float, latency_s: float | None, prompt_tokens: int, output_tokens: int,
            cached_tokens: int | None) -> None:
        self.start.append(start_s)
        self.end.append(start_s + latency_s if latency_s is not None else float("nan"))
        self.prompt.append(prompt_tokens)
        self.output.append(output_tokens)
        self.cached.append(-1 if cached_tokens is None else cached_tokens)

    def add_many(self, start_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> None:
        """Token-count traces: arrivals and lengths, no latency or cached tokens."""
        n = len(start_s)
        self.start.frombytes(np.ascontiguousarray(start_s, np.float64).tobytes())
        self.end.frombytes(np.full(n, np.nan).tobytes())
        self.prompt.frombytes(np.ascontiguousarray(prompt_tokens, np.int64).tobytes())
        self.output.frombytes(np.ascontiguousarray(output_tokens, np.int64).tobytes())
        self.cached.frombytes(np.full(n, -1, np.int64).tobytes())

    def to_parquet(self) -> bytes:
        table = pa.table([pa.array(np.frombuffer(a, t)) for a, t in
                          ((self.start, np.float64), (self.end, np.float64), (self.prompt, np.int64),
                           (self.output, np.int64), (self.cached, np.int64))], schema=_SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue().to_pybytes()


def read_production(pool_dir: str | Path) -> Timeline:
    """Production's timeline kept beside a pool (FileNotFoundError for a pool built without one)."""
    path = Path(pool_dir) / PRODUCTION_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the pool was built before production timelines were kept; "
                                "rebuild it")
    t = pq.read_table(path)
    return _timeline(*(t.column(n).to_numpy() for n in _SCHEMA.names))


def replay_timeline(records: list[RequestRecord]) -> Timeline:
    """A replay's timeline from its records (offsets from the replay's start)."""
    return _timeline([r.sent_s for r in records],
                     [r.end_s if r.end_s is not None else np.nan for r in records],
                     [r.prompt_tokens for r in records],
                     [r.output_tokens if r.status == "ok" else -1 for r in records],
                     [r.cached_tokens if r.cached_tokens is not None else -1 for r in records])
