"""Owns building a replay pool from logs: read, quarantine, redact (chat) or synthesize (traces), write, check.

Chat logs: each record is redacted in memory (``pool_chat``) before anything is written; prompt
tokens come from ``tokens.render_prompt`` + the counter (exact with a tokenizer file), block
hashes from ``tokens.block_hashes(text, 64)``. Large logs go through worker processes in bounded
batches (a few batches in flight, so memory stays bounded). Token traces: prompts are synthesized
from a block table keyed by hash id (``pool.block_text_for``), rows written in column batches.
Before that window, in file order: prompts that do not fit the model's context (``context_length``)
are quarantined, then timestamp outliers and records past the timeline's span or gap limits
(``logs.TimelineGate``), then repeats of a request id already accepted (the first one is kept).
Records are put in timestamp order through a bounded reorder window; later ones are quarantined.
The pool directory is built in a temp dir and moved into place only when everything succeeded.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from autoresearch_dagster.pool.fidelity import FidelityThresholds, compare, ks_check, token_change_check
from autoresearch_dagster.logs import (MOONCAKE_BLOCK_TOKENS, LogRecord, LogSource, Rejected, ReorderWindow,
                                      TimelineGate, TimelineLimits, TraceChunk, open_log)
from autoresearch_dagster.pool.schema import (POOL_SCHEMA, SPLIT_TRAINING_PERCENT, PoolWriter, assemble_trace_text,
                                              block_text_for, mix64_np, split_for)
from autoresearch_dagster.pool.chat import CHAT_BLOCK_TOKENS, init_worker, process_chat_batch
from autoresearch_dagster.workers import pool_initializer
from autoresearch_dagster.pool.production import PRODUCTION_FILE, ProductionLog
from autoresearch_dagster.pool.redact import KEY_ENV
from autoresearch_dagster.pool.workload import WorkloadStats
from autoresearch_dagster.spec import SpecError
from autoresearch_dagster.tokens import count_tokens, get_counter

TRACE_BATCH_LINES = 32768
PARALLEL_MIN_BYTES = 16 * 2**20  # below this, worker start-up costs more than it saves
SYNTH_SAMPLE = 100  # trace requests whose assembled prompts are re-counted by the fidelity check


@dataclass
class BuildResult:
    pool_path: Path
    fidelity: dict
    summary: dict
    quarantine_path: Path


def _batches(src: LogSource, max_records: int | None, n_read: list[int], size: int = 256
             ) -> Iterator[list[tuple[int, bytes]]]:
    for batch in src.line_batches(size):
        if max_records is not None:
            if n_read[0] >= max_records:
                return
            batch = batch[:max_records - n_read[0]]
        n_read[0] += len(batch)
        yield batch


def _chat_results(sources: list[LogSource], key: bytes, tokenizer_path: str | None, workers: int,
                  max_records: int | None, counts: Counter) -> Iterator[object]:
    """Rejections and (row, source stats) in file order; redaction counts accumulate into ``counts``.
    In one process the redactor (and its NER model) is set up here, when called, not at the first
    ``next()``: the caller calls this before it opens the pool's temp dir."""
    n_read = [0]
    if workers <= 1:
        init_worker(key, tokenizer_path)
        return _chat_inline(sources, max_records, n_read, counts)
    return _chat_pooled(sources, key, tokenizer_path, workers, max_records, n_read, counts)


def _chat_inline(sources: list[LogSource], max_records: int | None, n_read: list[int],
                 counts: Counter) -> Iterator[object]:
    for src in sources:
        for batch in _batches(src, max_records, n_read):
            items, delta = process_chat_batch(src.parser, batch)
            counts.update(delta)
            yield from items


def _chat_pooled(sources: list[LogSource], key: bytes, tokenizer_path: str | None, workers: int,
                 max_records: int | None, n_read: list[int], counts: Counter) -> Iterator[object]:
    # fork is cheap but unsafe when other threads run (Dagster, servers): spawn then. The key
    # travels by fork or by pipe, never to disk.
    single_threaded = sys.platform == "linux" and threading.active_count() == 1
    ctx = multiprocessing.get_context("fork" if single_threaded else "spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, **pool_initializer(init_worker, (key, tokenizer_path))) as ex:
        pending: deque = deque()
        for src in sources:
            for batch in _batches(src, max_records, n_read, 1024):
                pending.append(ex.submit(process_chat_batch, src.parser, batch))
                while len(pending) > 3 * workers:  # bounded in-flight work
                    items, delta = pending.popleft().result()
                    counts.update(delta)
                    yield from items
        while pending:
            items, delta = pending.popleft().result()
            counts.update(delta)
            yield from items


def _resolve_key(key: bytes | None) -> tuple[bytes, str]:
    if key is not None:
        return key, "caller"
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode(), "env:" + KEY_ENV
    return os.urandom(32), "random-per-process"


def _trace_training(chunk: TraceChunk) -> np.ndarray:
    """Split of trace rows: by session id when the trace has one, else by line (90/10, deterministic)."""
    training = (mix64_np(chunk.line) % np.uint64(100)) < np.uint64(SPLIT_TRAINING_PERCENT)
    if chunk.conversation is not None:
        for i, c in enumerate(chunk.conversation):
            if c is not None:
                training[i] = split_for(c) == "training"
    return training


class _TraceRows:
    """Turns accepted trace rows (columnar) into pool rows and registers their blocks with the writer."""

    def __init__(self, writer: PoolWriter, block_tokens: int):
        self.writer, self.block_tokens = writer, block_tokens
        self.sample: list[tuple[list[int], int, int]] = []
        self.chunks = 0

    def add(self, ch: TraceChunk, offsets: np.ndarray, training: np.ndarray, unique: np.ndarray) -> None:
        n, bt = len(ch), self.block_tokens
        self.writer.add_blocks(unique.tolist())
        lens = np.diff(ch.hash_offsets)
        seeds = (mix64_np(ch.line) & np.uint64(2**63 - 1)).astype(np.int64)
        tail = ch.n_in - np.minimum(lens, ch.n_in // bt) * bt
        cols = {
            "id": pa.array([f"line-{x}" for x in ch.line.tolist()], pa.string()),
            "arrival_s": pa.array(offsets, pa.float64()),
            "conversation_id": pa.array(ch.conversation or [None] * n, pa.string()),
            "api": pa.array(["chat"] * n, pa.string()),
            "sampling_json": pa.array(["{}"] * n, pa.string()),
            "prompt_tokens": pa.array(ch.n_in.astype(np.int32)), "output_tokens": pa.array(ch.n_out.astype(np.int32)),
            "output_tokens_source": pa.array(["recorded"] * n, pa.string()),
            "block_hashes": pa.ListArray.from_arrays(pa.array(ch.hash_offsets.astype(np.int32)),
                                                     pa.array(ch.hash_values, pa.int64())),
            "split": pa.array(np.where(training, "training", "serving").tolist(), pa.string()),
            "synth_tail_tokens": pa.array(tail.astype(np.int32)), "synth_seed": pa.array(seeds),
        }
        table = pa.Table.from_pydict({name: cols.get(name, pa.nulls(n, POOL_SCHEMA.field(name).type))
                                      for name in POOL_SCHEMA.names}, schema=POOL_SCHEMA)
        self.writer.add_table(table)
        self.chunks += 1
        picks = range(min(n, SYNTH_SAMPLE - len(self.sample))) if len(self.sample) < SYNTH_SAMPLE else [n // 2]
        for i in picks:
            row = (ch.hash_values[ch.hash_offsets[i]:ch.hash_offsets[i + 1]].tolist(), int(ch.n_in[i]), int(seeds[i]))
            if len(self.sample) < SYNTH_SAMPLE:
                self.sample.append(row)
            else:
                self.sample[self.chunks % SYNTH_SAMPLE] = row

    def synthesis_check(self) -> dict:
        """Assemble the sampled prompts and count them: each must have exactly the recorded count."""
        exact = 0
        for ids, n_tokens, seed in self.sample:
            blocks = {h: block_text_for(h, self.block_tokens) for h in ids}
            exact += count_tokens(assemble_trace_text(ids, n_tokens, self.block_tokens, seed, blocks)) == n_tokens
        frac = exact / len(self.sample) if self.sample else 1.0
        check = {"value": frac, "threshold": 1.0, "passed": frac == 1.0, "sampled": len(self.sample)}
        if frac < 1.0:
            check["message"] = (f"synthesis.token_count_exact: only {exact} of {len(self.sample)} assembled prompts "
                                "have the recorded token count")
        return check


def context_reason(prompt_tokens: int, context_length: int) -> str:
    return (f"prompt longer than the model's context: {prompt_tokens} tokens, the context holds {context_length} "
            "(prompt and at least one output token)")


def _fit_context(ch: TraceChunk, context_length: int | None, reject: Callable[[Rejected], None]) -> TraceChunk:
    """The chunk's rows whose prompts fit the context; the others quarantined."""
    if context_length is None:
        return ch
    over = ch.n_in >= context_length
    if not over.any():
        return ch
    for i in np.flatnonzero(over).tolist():
        reject(Rejected(int(ch.line[i]), context_reason(int(ch.n_in[i]), context_length), int(ch.nbytes[i])))
    return ch.select(~over)


def _chunk_records(ch: TraceChunk) -> list[LogRecord]:
    o = ch.hash_offsets
    return [LogRecord(line=int(ch.line[i]), timestamp_s=float(ch.ts[i]), kind="trace", nbytes=int(ch.nbytes[i]),
                      input_length=int(ch.n_in[i]), output_length=int(ch.n_out[i]),
                      hash_ids=ch.hash_values[o[i]:o[i + 1]].tolist(),
                      conversation_id=None if ch.conversation is None else ch.conversation[i])
            for i in range(len(ch))]


class _TraceOrder:
    """The reorder window's exact semantics for trace rows, with a columnar fast path.

    A chunk that is sorted and starts no earlier than anything seen goes through in one step: the
    window then behaves as a FIFO, releasing all but the rows within ``window_s`` of the newest (at
    most ``max_held``), which stay held as a columnar tail. Anything else goes record by record
    through ``ReorderWindow`` (the held tail is pushed into it first).
    """

    def __init__(self, window: ReorderWindow, emit: Callable[[TraceChunk], None], reject: Callable[[Rejected], None]):
        self.w, self.emit, self.reject = window, emit, reject
        self.tail: TraceChunk | None = None
        self.pending: list[LogRecord] = []

    def _release_pending(self) -> None:
        if self.pending:
            self.emit(TraceChunk.from_records(self.pending))
            self.pending = []

    def _push(self, rec: LogRecord) -> None:
        for out in self.w.push(rec.timestamp_s, rec.line, rec.nbytes, rec):
            if isinstance(out, Rejected):
                self.reject(out)
            else:
                self.pending.append(out)

    def _untail(self) -> None:
        if self.tail is not None:
            tail, self.tail = self.tail, None
            for rec in _chunk_records(tail):
                self._push(rec)

    def push_chunk(self, ch: TraceChunk) -> None:
        if not len(ch):
            return
        w = self.w
        if (len(ch) == 1 or bool((np.diff(ch.ts) >= 0).all())) and ch.ts[0] >= w._newest:
            held = [item for _, _, item in sorted(w._heap, key=lambda e: (e[0], e[1]))]
            w._heap.clear()
            self._release_pending()
            parts = ([TraceChunk.from_records(held)] if held else []) + ([self.tail] if self.tail else []) + [ch]
            combined = TraceChunk.concat(parts)
            newest = float(combined.ts[-1])
            n_held = min(len(combined) - int(np.searchsorted(combined.ts, newest - w.window_s, side="left")), w.max_held)
            n_out = len(combined) - n_held
            if n_out:
                self.emit(combined.take(0, n_out))
                w._released = max(w._released, float(combined.ts[n_out - 1]))
            self.tail = combined.take(n_out, len(combined)) if n_held else None
            w._newest = max(w._newest, newest)
        else:
            self._untail()
            for rec in _chunk_records(ch):
                self._push(rec)
            self._release_pending()

    def push_record(self, rec: LogRecord) -> None:
        self._untail()
        self._push(rec)

    def finish(self) -> None:
        self._untail()
        for out in self.w.drain():
            self.pending.append(out)
        self._release_pending()


def build_pool(logs: list[Path] | Path | str, endpoint: str, out_dir: Path | str, *, fmt: str = "auto",
               key: bytes | None = None, tokenizer_path: str | None = None,
               thresholds: FidelityThresholds | None = None, max_records: int | None = None,
               workers: int | None = None, reorder_window_s: float = 60.0, bulk: bool = True,
               context_length: int | None = None, timeline: TimelineLimits | None = None,
               _fail_after: int | None = None) -> BuildResult:
    """Build ``out_dir`` (replay_pool.parquet, blocks.parquet for traces, fidelity/summary/quarantine files,
    production.parquet: what production did, request by request, ``pool.production``).

    ``context_length``: the served model's context in tokens; a prompt that leaves no room for an
    output token is quarantined (None: no check). ``timeline``: the span and gap limits (default
    ``TimelineLimits()``). Raises SpecError (nothing written) when the input is unusable.
    ``bulk=False`` reads traces line by line only (same result, slower). ``_fail_after`` makes the build raise after that many
    accepted rows (tests of the atomic write use it).
    """
    t0 = time.perf_counter()
    paths = [Path(p) for p in ([logs] if isinstance(logs, (str, Path)) else logs)]
    if not paths:
        raise SpecError("no log files given")
    sources = [open_log(p, fmt) for p in paths]
    kinds = {s.kind for s in sources}
    if len(kinds) > 1:
        raise SpecError("cannot mix chat logs and token traces in one pool: " +
                        ", ".join(f"{s.path.name}={s.format}" for s in sources))
    kind = kinds.pop()
    thresholds = thresholds or FidelityThresholds()
    timeline = timeline or TimelineLimits()
    if context_length is not None and context_length < 2:
        raise SpecError(f"context length must be at least 2 tokens, got {context_length}")
    key, key_source = _resolve_key(key)
    counter_name, _ = get_counter(tokenizer_path)
    out_dir = Path(out_dir)
    if workers is None:
        total = sum(p.stat().st_size for p in paths)
        workers = min(os.cpu_count() or 1, 4) if kind == "chat" and total >= PARALLEL_MIN_BYTES else 1
    if kind == "trace":
        counter_name = get_counter(None)[0]  # synthesized text is exact under the approx counter only
        block_tokens = MOONCAKE_BLOCK_TOKENS if any(s.format == "mooncake" for s in sources) else CHAT_BLOCK_TOKENS
    else:
        block_tokens = CHAT_BLOCK_TOKENS

    windows = tuple(thresholds.idc_windows_s)
    source_stats = WorkloadStats(block_tokens=block_tokens, windows=windows)
    pool_stats = WorkloadStats(block_tokens=block_tokens, windows=windows)
    serving = WorkloadStats(block_tokens=block_tokens, windows=())  # the serving split, for its prompt-length KS check
    production = ProductionLog()  # what production did, request by request (replay-vs-production fidelity)
    if kind == "trace":
        pool_stats.cache = source_stats.cache  # the pool's block_hashes are the source's hash ids, verbatim
    rejected: list[dict] = []
    reasons: Counter = Counter()
    redactions: Counter = Counter()
    window = ReorderWindow(window_s=reorder_window_s)
    rows_in = accepted = 0
    src_tokens_total = pool_tokens_total = 0
    out_sources: Counter = Counter()
    splits: Counter = Counter()
    t_first: float | None = None
    span = [0.0]  # the pool's timeline: the last arrival offset
    first_line: dict[int, int] = {}  # accepted request id (its keyed hash) -> line of its first record
    duplicates = 0

    def reject(r: Rejected) -> None:
        rejected.append(r.to_json())
        reasons[r.reason.split(":")[0].split(" (")[0]] += 1

    # set up before the temp dir exists (loading the NER model is the slow part of starting)
    chat_items = _chat_results(sources, key, tokenizer_path, workers, max_records, redactions) \
        if kind == "chat" else None
    with PoolWriter(out_dir) as writer:
        trace_rows = _TraceRows(writer, block_tokens) if kind == "trace" else None

        def count_accepted(n: int) -> None:
            nonlocal accepted
            accepted += n
            if _fail_after is not None and accepted >= _fail_after:
                raise RuntimeError(f"injected failure after {accepted} rows")

        def emit_chat(item: tuple[dict, dict]) -> None:
            nonlocal t_first, src_tokens_total, pool_tokens_total
            row, src = item
            ts = row["arrival_s"]
            t_first = ts if t_first is None else t_first
            row["arrival_s"] = offset = round(ts - t_first, 6)
            span[0] = max(span[0], offset)
            latency, n_out, n_pool = row["source_latency_s"], row["output_tokens"], row["prompt_tokens"]
            source_stats.add(ts, src["prompt_tokens"], n_out,
                             row["block_hashes"] if src["hashes"] is None else src["hashes"], latency)
            pool_stats.add(offset, n_pool, n_out, row["block_hashes"], latency)
            if row["split"] == "serving":
                serving.add(offset, n_pool, n_out)
            logged = src["usage_prompt_tokens"]
            production.add(offset, latency, src["prompt_tokens"] if logged is None else logged, n_out,
                           src["cached_tokens"])
            writer.add_row(row)
            src_tokens_total += src["prompt_tokens"]
            pool_tokens_total += n_pool
            out_sources[row["output_tokens_source"]] += 1
            splits[row["split"]] += 1
            count_accepted(1)

        def emit_trace(ch: TraceChunk) -> None:
            nonlocal t_first, src_tokens_total, pool_tokens_total
            t_first = float(ch.ts[0]) if t_first is None else t_first
            offsets = np.round(ch.ts - t_first, 6)
            span[0] = max(span[0], float(offsets.max()))
            training = _trace_training(ch)
            unique = np.unique(ch.hash_values)
            source_stats.add_many(ch.ts, ch.n_in, ch.n_out, ch.hash_values, unique)
            pool_stats.add_many(offsets, ch.n_in, ch.n_out)  # shares the source's prefix cache (same ids)
            serve = ~training
            serving.add_many(offsets[serve], ch.n_in[serve], ch.n_out[serve])
            production.add_many(offsets, ch.n_in, ch.n_out)
            trace_rows.add(ch, offsets, training, unique)
            total = int(ch.n_in.sum())
            src_tokens_total += total
            pool_tokens_total += total
            out_sources["recorded"] += len(ch)
            splits["training"] += int(training.sum())
            splits["serving"] += int(serve.sum())
            count_accepted(len(ch))

        if kind == "chat":
            def admit_chat(item: tuple[dict, dict], _keep: None) -> None:
                nonlocal duplicates
                row, src = item
                if row["id"].startswith("r-"):  # a logged request id (keyed hash); "line-N" ids are unique
                    rid = int(row["id"][2:], 16)
                    if rid in first_line:
                        duplicates += 1
                        reject(Rejected(src["line"], f"duplicate request id: first seen on line {first_line[rid]}",
                                        src["nbytes"]))
                        return
                    first_line[rid] = src["line"]
                for out in window.push(row["arrival_s"], src["line"], src["nbytes"], item):
                    if isinstance(out, Rejected):
                        reject(out)
                    else:
                        emit_chat(out)

            gate = TimelineGate(timeline, admit_chat, reject)
            for item in chat_items:
                rows_in += 1
                if isinstance(item, Rejected):
                    reject(item)
                    continue
                row, src = item
                if context_length is not None and row["prompt_tokens"] >= context_length:
                    reject(Rejected(src["line"], context_reason(row["prompt_tokens"], context_length), src["nbytes"]))
                    continue
                gate.push_one(row["arrival_s"], src["line"], src["nbytes"], item)
            gate.finish()
            for out in window.drain():
                emit_chat(out)
        else:
            order = _TraceOrder(window, emit_trace, reject)

            def admit_trace(item: TraceChunk | LogRecord, keep: np.ndarray | None) -> None:
                if isinstance(item, TraceChunk):
                    order.push_chunk(item if keep is None else item.select(keep))
                else:
                    order.push_record(item)

            gate = TimelineGate(timeline, admit_trace, reject)
            n_read = [0]
            for src in sources:
                for batch in _batches(src, max_records, n_read, TRACE_BATCH_LINES):
                    rows_in += len(batch)
                    chunk, rest = src.parse_bulk(batch, block_tokens) if bulk else (None, [src.parse(n, r) for n, r in batch])
                    if chunk is not None:
                        chunk = _fit_context(chunk, context_length, reject)
                        gate.push_many(chunk.ts, chunk.line, chunk.nbytes, chunk)
                    for r in rest:
                        if isinstance(r, Rejected):
                            reject(r)
                        elif context_length is not None and r.input_length >= context_length:
                            reject(Rejected(r.line, context_reason(r.input_length, context_length), r.nbytes))
                        else:
                            gate.push_one(r.timestamp_s, r.line, r.nbytes, r)
            gate.finish()
            order.finish()

        if accepted == 0:
            first = rejected[0]["reason"] if rejected else "no records"
            raise SpecError(f"nothing usable was read from {', '.join(map(str, paths))}: "
                            f"{len(rejected)} of {rows_in} records quarantined (first: {first})")

        extra = {}
        if kind == "chat":
            extra["redaction.prompt_token_change"] = token_change_check(src_tokens_total, pool_tokens_total, thresholds)
        else:
            extra["synthesis.token_count_exact"] = trace_rows.synthesis_check()
        if len(source_stats) >= thresholds.min_split_requests:  # the serving split (what replays) vs the source
            extra["serving_split.prompt_tokens.ks"] = ks_check("serving_split.prompt_tokens.ks",
                                                                source_stats.prompt_sample, serving.prompt_sample,
                                                                thresholds.ks_max)
        else:
            extra["serving_split.prompt_tokens.ks"] = {
                "value": None, "threshold": thresholds.ks_max, "passed": True,
                "skipped": f"fewer than {thresholds.min_split_requests} requests"}
        fidelity = compare(source_stats, pool_stats, thresholds, extra=extra)
        summary = {
            "endpoint": endpoint, "logs": [str(p) for p in paths], "format": sorted({s.format for s in sources}),
            "kind": kind, "rows_in": rows_in, "rows_accepted": accepted, "rows_quarantined": len(rejected),
            "quarantine_reasons": dict(reasons.most_common()), "redactions": dict(sorted(redactions.items())),
            "prompt_tokens_source": src_tokens_total, "prompt_tokens_pool": pool_tokens_total,
            "prompt_token_change": (pool_tokens_total - src_tokens_total) / src_tokens_total if src_tokens_total else 0.0,
            "output_tokens_source": dict(out_sources), "splits": dict(splits), "token_counter": counter_name,
            "block_tokens": block_tokens, "fidelity_passed": fidelity["passed"], "workers": workers,
            "duplicate_request_ids": duplicates, "context_length": context_length,
            "timeline": {"span_s": span[0], "max_span_s": timeline.max_span_s, "max_gap_s": timeline.max_gap_s},
        }
        if summary["rows_in"] != summary["rows_accepted"] + summary["rows_quarantined"]:
            raise RuntimeError(f"record counts do not reconcile: {summary}")
        meta = {"endpoint": endpoint, "token_counter": counter_name, "block_tokens": block_tokens,
                "source_format": summary["format"], "kind": kind, "redactions": summary["redactions"],
                "redaction_key_source": key_source, "rows_quarantined": len(rejected),
                "prompt_token_change": summary["prompt_token_change"], "fidelity_passed": fidelity["passed"],
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        summary["content_hash"] = writer.content_hash(block_tokens)
        summary["build_seconds"] = round(time.perf_counter() - t0, 3)
        writer.write_file("fidelity.json", json.dumps(fidelity, indent=2, default=float))
        writer.write_file(PRODUCTION_FILE, production.to_parquet())
        writer.write_file("quarantine.jsonl", "".join(json.dumps(r) + "\n" for r in rejected))
        writer.write_file("summary.json", json.dumps(summary, indent=2))
        pool_path = writer.commit(meta)
    return BuildResult(pool_path=pool_path, fidelity=fidelity, summary=summary,
                       quarantine_path=out_dir / "quarantine.jsonl")


__all__ = ["BuildResult", "build_pool"]
