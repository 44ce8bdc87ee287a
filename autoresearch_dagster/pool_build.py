"""Owns building a replay pool from logs: read, quarantine, redact (chat) or synthesize (traces), write, check.

Chat logs: each record is redacted in memory (``pool_chat``) before anything is written; prompt
tokens come from ``tokens.render_prompt`` + the counter (exact with a tokenizer file), block
hashes from ``tokens.block_hashes(text, 64)``. Large logs go through worker processes in bounded
batches (a few batches in flight, so memory stays bounded). Token traces: prompts are synthesized
from a block table keyed by hash id (``pool.block_text_for``), rows written in column batches.
Records are put in timestamp order through a bounded reorder window; later ones are quarantined.
The pool directory is built in a temp dir and moved into place only when everything succeeded.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from autoresearch_dagster.fidelity import FidelityThresholds, WorkloadStats, compare, ks_check, token_change_check
from autoresearch_dagster.logs import MOONCAKE_BLOCK_TOKENS, LogRecord, LogSource, Rejected, ReorderWindow, open_log
from autoresearch_dagster.pool import PoolWriter, assemble_trace_text, block_text_for, split_for
from autoresearch_dagster.pool_chat import CHAT_BLOCK_TOKENS, init_worker, process_chat_batch
from autoresearch_dagster.redact import KEY_ENV
from autoresearch_dagster.spec import SpecError
from autoresearch_dagster.tokens import count_tokens, get_counter

BATCH_LINES = 256
PARALLEL_MIN_BYTES = 16 * 2**20  # below this, worker start-up costs more than it saves
SYNTH_SAMPLE = 100  # trace requests whose assembled prompts are re-counted by the fidelity check
TRACE_FLUSH_ROWS = 65536


@dataclass
class BuildResult:
    pool_path: Path
    fidelity: dict
    summary: dict
    quarantine_path: Path


def _batches(src: LogSource, max_records: int | None, n_read: list[int]) -> Iterator[list[tuple[int, bytes]]]:
    batch: list[tuple[int, bytes]] = []
    for line, raw in src.lines():
        if max_records is not None and n_read[0] >= max_records:
            break
        n_read[0] += 1
        batch.append((line, raw))
        if len(batch) >= BATCH_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


def _chat_results(sources: list[LogSource], key: bytes, tokenizer_path: str | None, workers: int,
                  max_records: int | None, counts: Counter) -> Iterator[object]:
    """Rejections and (row, source stats) in file order; redaction counts accumulate into ``counts``."""
    n_read = [0]
    if workers <= 1:
        init_worker(key, tokenizer_path)
        for src in sources:
            for batch in _batches(src, max_records, n_read):
                items, delta = process_chat_batch(src.parser, batch)
                counts.update(delta)
                yield from items
        return
    # spawn, not fork: safe inside threaded hosts such as Dagster; the key travels by pipe, never to disk
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker, initargs=(key, tokenizer_path)) as ex:
        pending: deque = deque()
        for src in sources:
            for batch in _batches(src, max_records, n_read):
                pending.append(ex.submit(process_chat_batch, src.parser, batch))
                while len(pending) > 3 * workers:  # bounded in-flight work
                    items, delta = pending.popleft().result()
                    counts.update(delta)
                    yield from items
        while pending:
            items, delta = pending.popleft().result()
            counts.update(delta)
            yield from items


def _trace_records(sources: list[LogSource], max_records: int | None) -> Iterator[object]:
    n = 0
    for src in sources:
        for line, raw in src.lines():
            if max_records is not None and n >= max_records:
                return
            n += 1
            yield src.parse(line, raw)


def _resolve_key(key: bytes | None) -> tuple[bytes, str]:
    if key is not None:
        return key, "caller"
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode(), "env:" + KEY_ENV
    return os.urandom(32), "random-per-process"


class _TraceColumns:
    """Accumulates trace rows as columns and registers their blocks with the writer."""

    NAMES = ("id", "arrival_s", "conversation_id", "api", "sampling_json", "prompt_tokens", "output_tokens",
             "output_tokens_source", "block_hashes", "split", "synth_tail_tokens", "synth_seed")

    def __init__(self, writer: PoolWriter, block_tokens: int):
        self.writer, self.block_tokens = writer, block_tokens
        self.cols: dict[str, list] = {n: [] for n in self.NAMES}
        self.sample: list[tuple[list[int], int, int]] = []
        self.n = 0

    def add(self, rec: LogRecord, arrival_s: float) -> str:
        bt, w = self.block_tokens, self.writer
        ids = rec.hash_ids or []
        for h in ids:
            w.add_block(h)
        n_full = min(len(ids), rec.input_length // bt)
        seed = (rec.line * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & (2**63 - 1)
        conv = rec.conversation_id
        split = split_for(conv or f"line-{rec.line}")
        c = self.cols
        c["id"].append(f"line-{rec.line}")
        c["arrival_s"].append(arrival_s)
        c["conversation_id"].append(conv)
        c["api"].append("chat")
        c["sampling_json"].append("{}")
        c["prompt_tokens"].append(rec.input_length)
        c["output_tokens"].append(rec.output_length)
        c["output_tokens_source"].append("recorded")
        c["block_hashes"].append(ids)
        c["split"].append(split)
        c["synth_tail_tokens"].append(rec.input_length - n_full * bt)
        c["synth_seed"].append(seed)
        self.n += 1
        if len(self.sample) < SYNTH_SAMPLE:
            self.sample.append((ids, rec.input_length, seed))
        elif self.n % 97 == 0:
            self.sample[self.n % SYNTH_SAMPLE] = (ids, rec.input_length, seed)
        if len(c["id"]) >= TRACE_FLUSH_ROWS:
            self.flush()
        return split

    def flush(self) -> None:
        if self.cols["id"]:
            self.writer.add_columns(self.cols)
            self.cols = {n: [] for n in self.NAMES}

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


def build_pool(logs: list[Path] | Path | str, endpoint: str, out_dir: Path | str, *, fmt: str = "auto",
               key: bytes | None = None, tokenizer_path: str | None = None,
               thresholds: FidelityThresholds | None = None, max_records: int | None = None,
               workers: int | None = None, reorder_window_s: float = 60.0, _fail_after: int | None = None) -> BuildResult:
    """Build ``out_dir`` (replay_pool.parquet, blocks.parquet for traces, fidelity/summary/quarantine files).

    Raises SpecError (nothing written) when the input is unusable. ``_fail_after`` makes the build
    raise after that many accepted rows (tests of the atomic write use it).
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

    source_stats, pool_stats, serving = WorkloadStats(), WorkloadStats(), WorkloadStats()
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

    def reject(r: Rejected) -> None:
        rejected.append(r.to_json())
        reasons[r.reason.split(":")[0].split(" (")[0]] += 1

    with PoolWriter(out_dir) as writer:
        trace_cols = _TraceColumns(writer, block_tokens) if kind == "trace" else None

        def emit(item: object) -> None:
            nonlocal accepted, t_first, src_tokens_total, pool_tokens_total
            if kind == "chat":
                row, src = item
                ts = row["arrival_s"]
                t_first = ts if t_first is None else t_first
                row["arrival_s"] = offset = round(ts - t_first, 6)
                latency, n_out, n_pool = row["source_latency_s"], row["output_tokens"], row["prompt_tokens"]
                source_stats.add(ts, src["prompt_tokens"], n_out, src["hashes"], latency)
                pool_stats.add(offset, n_pool, n_out, row["block_hashes"], latency)
                split = row["split"]
                writer.add_row(row)
                n_src = src["prompt_tokens"]
                out_sources[row["output_tokens_source"]] += 1
            else:
                rec = item
                ts = rec.timestamp_s
                t_first = ts if t_first is None else t_first
                offset = round(ts - t_first, 6)
                n_src = n_pool = rec.input_length
                n_out = rec.output_length
                source_stats.add(ts, n_src, n_out, rec.hash_ids or ())
                pool_stats.add(offset, n_pool, n_out)
                split = trace_cols.add(rec, offset)
                out_sources["recorded"] += 1
            if split == "serving":
                serving.add(offset, n_pool, n_out)
            src_tokens_total += n_src
            pool_tokens_total += n_pool
            splits[split] += 1
            accepted += 1
            if _fail_after is not None and accepted >= _fail_after:
                raise RuntimeError(f"injected failure after {accepted} rows")

        stream = (_chat_results(sources, key, tokenizer_path, workers, max_records, redactions) if kind == "chat"
                  else _trace_records(sources, max_records))
        for item in stream:
            rows_in += 1
            if isinstance(item, Rejected):
                reject(item)
                continue
            if kind == "chat":
                ts, line, nbytes = item[0]["arrival_s"], item[1]["line"], item[1]["nbytes"]
            else:
                ts, line, nbytes = item.timestamp_s, item.line, item.nbytes
            for out in window.push(ts, line, nbytes, item):
                if isinstance(out, Rejected):
                    reject(out)
                else:
                    emit(out)
        for out in window.drain():
            emit(out)
        if trace_cols is not None:
            trace_cols.flush()

        if accepted == 0:
            first = rejected[0]["reason"] if rejected else "no records"
            raise SpecError(f"nothing usable was read from {', '.join(map(str, paths))}: "
                            f"{len(rejected)} of {rows_in} records quarantined (first: {first})")

        extra = {}
        if kind == "chat":
            extra["redaction.prompt_token_change"] = token_change_check(src_tokens_total, pool_tokens_total, thresholds)
        else:
            extra["synthesis.token_count_exact"] = trace_cols.synthesis_check()
        if len(source_stats) >= thresholds.min_split_requests:  # the serving split (what replays) vs the source
            extra["serving_split.prompt_tokens.ks"] = ks_check("serving_split.prompt_tokens.ks",
                                                                source_stats.prompt_tokens, serving.prompt_tokens,
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
        writer.write_file("quarantine.jsonl", "".join(json.dumps(r) + "\n" for r in rejected))
        writer.write_file("summary.json", json.dumps(summary, indent=2))
        pool_path = writer.commit(meta)
    return BuildResult(pool_path=pool_path, fidelity=fidelity, summary=summary,
                       quarantine_path=out_dir / "quarantine.jsonl")


__all__ = ["BuildResult", "build_pool"]
