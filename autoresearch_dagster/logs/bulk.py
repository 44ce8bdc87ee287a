"""Owns bulk (columnar) parsing of token-trace chunks with pyarrow: the fast path of the trace readers.

A chunk of raw lines is parsed at once by pyarrow's CSV / JSON readers and validated with numpy.
Rows that fail validation are handed back to the per-line reader (``LogSource.parse``), which
gives them their exact quarantine reason; a chunk pyarrow cannot parse at all (a malformed line,
a wrong type, bad UTF-8) goes entirely through the per-line reader. Both paths accept exactly the
same records with the same values (a test pins this).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from autoresearch_dagster.logs.records import MAX_TOKENS


@dataclass
class TraceChunk:
    """Accepted trace rows as columns; ``hash_values``/``hash_offsets`` flatten the per-row hash_ids."""
    line: np.ndarray        # int64
    ts: np.ndarray          # float64, seconds as read
    n_in: np.ndarray        # int64
    n_out: np.ndarray       # int64
    nbytes: np.ndarray      # int64
    hash_values: np.ndarray  # int64
    hash_offsets: np.ndarray  # int64, len = rows + 1
    conversation: list | None = None  # per-row session id or None; None when no row has one

    def __len__(self) -> int:
        return len(self.line)

    def take(self, start: int, stop: int) -> "TraceChunk":
        o = self.hash_offsets
        return TraceChunk(self.line[start:stop], self.ts[start:stop], self.n_in[start:stop], self.n_out[start:stop],
                          self.nbytes[start:stop], self.hash_values[o[start]:o[stop]], o[start:stop + 1] - o[start],
                          None if self.conversation is None else self.conversation[start:stop])

    def select(self, keep: np.ndarray) -> "TraceChunk":
        """The rows where ``keep`` (a boolean mask) is true, in order."""
        lens = np.diff(self.hash_offsets)
        return TraceChunk(self.line[keep], self.ts[keep], self.n_in[keep], self.n_out[keep], self.nbytes[keep],
                          self.hash_values[np.repeat(keep, lens)],
                          np.concatenate([np.zeros(1, np.int64), np.cumsum(lens[keep])]),
                          None if self.conversation is None else [c for c, k in zip(self.conversation, keep) if k])

    @staticmethod
    def concat(parts: list["TraceChunk"]) -> "TraceChunk":
        parts = [p for p in parts if len(p)]
        if len(parts) == 1:
            return parts[0]
        offsets, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            offsets.append(p.hash_offsets[1:] + base)
            base += int(p.hash_offsets[-1])
        conv = None
        if any(p.conversation is not None for p in parts):
            conv = [c for p in parts for c in (p.conversation or [None] * len(p))]
        return TraceChunk(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("line", "ts", "n_in", "n_out", "nbytes")),
                          np.concatenate([p.hash_values for p in parts]), np.concatenate(offsets), conv)

    @staticmethod
    def from_records(records: list) -> "TraceChunk":
        ids = [r.hash_ids or [] for r in records]
        lens = np.array([len(x) for x in ids], np.int64)
        conv = [r.conversation_id for r in records]
        return TraceChunk(np.array([r.line for r in records], np.int64), np.array([r.timestamp_s for r in records]),
                          np.array([r.input_length for r in records], np.int64),
                          np.array([r.output_length for r in records], np.int64),
                          np.array([r.nbytes for r in records], np.int64),
                          np.array([h for x in ids for h in x], np.int64),
                          np.concatenate([np.zeros(1, np.int64), np.cumsum(lens)]),
                          conv if any(c is not None for c in conv) else None)


_MOONCAKE_SCHEMA = pa.schema([("timestamp", pa.float64()), ("input_length", pa.int64()),
                              ("output_length", pa.int64()), ("hash_ids", pa.list_(pa.int64())),
                              ("session_id", pa.string())])


def _table(fmt: str, header_names: list[str] | None, columns: dict[str, str] | None, data: bytes) -> pa.Table | None:
    try:
        if fmt == "mooncake":
            return pjson.read_json(io.BytesIO(data), parse_options=pjson.ParseOptions(
                explicit_schema=_MOONCAKE_SCHEMA, unexpected_field_behavior="ignore", newlines_in_values=False))
        types = {columns["in"]: pa.int64(), columns["out"]: pa.int64(),
                 columns["ts"]: pa.timestamp("ns") if fmt == "azure" else pa.float64()}
        return pcsv.read_csv(io.BytesIO(data), read_options=pcsv.ReadOptions(column_names=header_names),
                             convert_options=pcsv.ConvertOptions(column_types=types, include_columns=list(types)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def parse_chunk(fmt: str, batch: list[tuple[int, bytes]], *, header_names: list[str] | None = None,
                columns: dict[str, str] | None = None, block_tokens: int = 512
                ) -> tuple[TraceChunk, list[tuple[int, bytes]]] | None:
    """(accepted rows, lines to re-read one by one), or None when the chunk must be read line by line."""
    if any(not raw or b"\n" in raw or b"\r" in raw for _, raw in batch):
        return None
    table = _table(fmt, header_names, columns, b"\n".join(raw for _, raw in batch) + b"\n")
    if table is None or table.num_rows != len(batch):
        return None
    if fmt == "mooncake":
        ts_col, in_col, out_col = table.column("timestamp"), table.column("input_length"), table.column("output_length")
        ids_col = table.column("hash_ids").combine_chunks()
        sess = table.column("session_id")
    else:
        ts_col, in_col, out_col = table.column(columns["ts"]), table.column(columns["in"]), table.column(columns["out"])
        ids_col, sess = None, None
    nulls = np.zeros(len(batch), bool)
    for col in (ts_col, in_col, out_col):
        if col.null_count:
            nulls |= col.is_null().to_numpy(zero_copy_only=False)
    if fmt == "azure":
        us = pc.divide(pc.cast(ts_col.fill_null(0), pa.int64()), 1000).to_numpy()  # microseconds, as datetime does
        ts = us / 1e6
    else:
        ts = ts_col.fill_null(0).to_numpy().astype(np.float64)
        if fmt == "mooncake":
            ts = ts / 1000.0
    n_in = in_col.fill_null(0).to_numpy().astype(np.int64)
    n_out = out_col.fill_null(0).to_numpy().astype(np.int64)
    bad = nulls | ~np.isfinite(ts) | (ts < 0) | (n_in <= 0) | (n_in > MAX_TOKENS) | (n_out <= 0) | (n_out > MAX_TOKENS)
    if ids_col is not None:
        if ids_col.null_count:
            bad |= ids_col.is_null().to_numpy(zero_copy_only=False)
        lens = pc.list_value_length(ids_col).fill_null(0).to_numpy().astype(np.int64)
        bad |= lens > -(-n_in // block_tokens)
        flat = pc.list_flatten(ids_col)
        values = flat.fill_null(-1).to_numpy().astype(np.int64) if len(flat) else np.zeros(0, np.int64)
        if len(values) and (values < 0).any():
            owner = np.repeat(np.arange(len(batch)), lens)
            bad[np.unique(owner[values < 0])] = True
    else:
        lens = np.zeros(len(batch), np.int64)
        values = np.zeros(0, np.int64)
    conv = None
    if sess is not None and sess.null_count < len(batch):
        conv = sess.to_pylist()
    retry = [batch[i] for i in np.flatnonzero(bad)]
    keep = ~bad
    lines = np.fromiter((ln for ln, _ in batch), np.int64, len(batch))
    nbytes = np.fromiter((len(raw) for _, raw in batch), np.int64, len(batch))
    if bad.any():
        owner_keep = np.repeat(keep, lens)
        values = values[owner_keep]
        lens = lens[keep]
        conv = None if conv is None else [c for c, k in zip(conv, keep) if k]
    offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lens)])
    return TraceChunk(lines[keep], ts[keep], n_in[keep], n_out[keep], nbytes[keep], values, offsets, conv), retry
