"""Owns building a replay pool from logs: read, quarantine, redact (chat) or synthesize (traces), write, check.

Chat logs: each record is redacted in memory (``redact.Redactor``) before anything is written;
prompt tokens come from ``tokens.render_prompt`` + the counter (exact with a tokenizer file),
block hashes from ``tokens.block_hashes(text, 64)``. Large logs are processed by worker
processes in bounded batches (memory stays bounded: at most a few batches in flight). Token
traces: prompts are synthesized from a block table keyed by hash id (``pool.block_text_for``).
Records are put in timestamp order through a bounded reorder window; later ones are quarantined.
The pool directory is built in a temp dir and moved into place only when everything succeeded.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import multiprocessing
import os
import time
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from autoresearch_dagster.fidelity import FidelityThresholds, WorkloadStats, compare, ks_check, token_change_check
from autoresearch_dagster.logs import LogRecord, LogSource, Rejected, ReorderWindow, open_log
from autoresearch_dagster.pool import (BLOCKS_FILE, POOL_FILE, PoolRequest, PoolWriter, assemble_trace_text,
                                       block_text_for, read_pool, split_for)
from autoresearch_dagster.redact import KEY_ENV, Redactor
from autoresearch_dagster.spec import SpecError
from autoresearch_dagster.tokens import block_hashes, count_tokens, get_counter, render_prompt

CHAT_BLOCK_TOKENS = 64
DEFAULT_OUTPUT_TOKENS = 256  # used only when a log has neither usage nor max_tokens (recorded as "estimate")
BATCH_LINES = 256
PARALLEL_MIN_BYTES = 16 * 2**20  # below this, worker start-up costs more than it saves
SYNTH_SAMPLE = 200


@dataclass
class BuildResult:
    pool_path: Path
    fidelity: dict
    summary: dict
    quarantine_path: Path


# ------------------------------------------------------------------------------------------------
# chat logs: per-batch work (runs in worker processes for large logs)

_worker: dict[str, Any] = {}


def _init_worker(key: bytes, tokenizer_path: str | None) -> None:
    _worker["redactor"] = Redactor(key)
    _worker["counter"] = get_counter(tokenizer_path)[1]
    _worker["key"] = key


def _conversation_key(rec: LogRecord, key: bytes, redacted_messages: list[dict] | None) -> str:
    # Logged ids may be personal (an e-mail as a session id): only a keyed hash of them is kept.
    if rec.conversation_id is not None:
        basis = "id:" + rec.conversation_id
    else:  # inferred: same system prompt + first user message => same conversation
        msgs = redacted_messages or []
        lead = [m for m in msgs if m.get("role") in ("system", "developer")][:1] + \
               [m for m in msgs if m.get("role") == "user"][:1]
        basis = "msg:" + json.dumps(lead, sort_keys=True, ensure_ascii=False) if lead else "prompt:" + (rec.prompt or "")
    return "c-" + hmac.new(key, basis.encode(), hashlib.sha256).hexdigest()[:16]


def process_chat_record(rec: LogRecord, redactor: Redactor, counter, key: bytes) -> tuple[PoolRequest, dict]:
    """Redact one record and derive its pool row; also returns the source-side statistics (pre-redaction)."""
    orig_text = render_prompt(rec.messages, rec.tools, rec.prompt)
    src_tokens = counter(orig_text)
    messages = redactor.redact_messages(rec.messages) if rec.messages is not None else None
    prompt = redactor.redact_text(rec.prompt) if rec.prompt is not None else None
    tools = redactor.redact_json(rec.tools) if rec.tools is not None else None
    response_format = redactor.redact_json(rec.response_format) if rec.response_format is not None else None
    tool_choice = redactor.redact_json(rec.tool_choice) if rec.tool_choice is not None else None
    new_text = render_prompt(messages, tools, prompt)
    if new_text == orig_text:
        tokens, hashes = src_tokens, block_hashes(new_text, CHAT_BLOCK_TOKENS)
        src_hashes = hashes
    else:
        tokens, hashes = counter(new_text), block_hashes(new_text, CHAT_BLOCK_TOKENS)
        src_hashes = block_hashes(orig_text, CHAT_BLOCK_TOKENS)
    if rec.usage_completion_tokens is not None:
        out, out_src = rec.usage_completion_tokens, "usage"
    elif rec.sampling.get("max_completion_tokens") or rec.sampling.get("max_tokens"):
        out, out_src = rec.sampling.get("max_completion_tokens") or rec.sampling["max_tokens"], "max_tokens"
    else:
        out, out_src = DEFAULT_OUTPUT_TOKENS, "estimate"
    conv = _conversation_key(rec, key, messages)
    turn = sum(1 for m in messages if m.get("role") == "user") if messages is not None else None
    rid = redactor.redact_text(rec.request_id) if rec.request_id else None
    req = PoolRequest(
        id=rid or f"line-{rec.line}", arrival_s=rec.timestamp_s, conversation_id=conv, turn=turn, api=rec.api,
        messages=messages, prompt=prompt, tools=tools, tool_choice=tool_choice, response_format=response_format,
        sampling=rec.sampling, prompt_tokens=tokens, output_tokens=out, block_hashes=hashes,
        block_tokens=CHAT_BLOCK_TOKENS, split=split_for(conv), output_tokens_source=out_src,
        source_latency_s=rec.latency_s)
    src = {"prompt_tokens": src_tokens, "hashes": src_hashes, "line": rec.line, "nbytes": rec.nbytes}
    return req, src


def _process_chat_batch(parser, batch: list[tuple[int, bytes]]) -> tuple[list, dict]:
    redactor: Redactor = _worker["redactor"]
    before = Counter(redactor.counts)
    out = []
    from autoresearch_dagster.logs import parse_line

    for line, raw in batch:
        rec = parse_line(parser, line, raw)
        if isinstance(rec, Rejected):
            out.append(rec)
        else:
            out.append(process_chat_record(rec, redactor, _worker["counter"], _worker["key"]))
    delta = Counter(redactor.counts)
    delta.subtract(before)
    return out, {k: v for k, v in delta.items() if v}


def _batches(src: LogSource, max_records: int | None, counter: list[int]) -> Iterator[list[tuple[int, bytes]]]:
    batch: list[tuple[int, bytes]] = []
    for line, raw in src.lines():
        if max_records is not None and counter[0] >= max_records:
            break
        counter[0] += 1
        batch.append((line, raw))
        if len(batch) >= BATCH_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


def _chat_results(sources: list[LogSource], key: bytes, tokenizer_path: str | None, workers: int,
                  max_records: int | None, counts: Counter) -> Iterator[object]:
    """Processed records / rejections in file order; redaction counts accumulate into ``counts``."""
    n_read = [0]
    if workers <= 1:
        _init_worker(key, tokenizer_path)
        for src in sources:
            for batch in _batches(src, max_records, n_read):
                items, delta = _process_chat_batch(src.parser, batch)
                counts.update(delta)
                yield from items
        return
    ctx = multiprocessing.get_context("spawn")  # safe inside threaded hosts (Dagster); workers import little
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(key, tokenizer_path)) as ex:
        pending: deque = deque()
        for src in sources:
            for batch in _batches(src, max_records, n_read):
                pending.append(ex.submit(_process_chat_batch, src.parser, batch))
                while len(pending) > 3 * workers:  # bounded in-flight work
                    items, delta = pending.popleft().result()
                    counts.update(delta)
                    yield from items
        while pending:
            items, delta = pending.popleft().result()
            counts.update(delta)
            yield from items


# ------------------------------------------------------------------------------------------------
# token traces

def _trace_requests(sources: list[LogSource], max_records: int | None) -> Iterator[object]:
    n = 0
    for src in sources:
        for line, raw in src.lines():
            if max_records is not None and n >= max_records:
                return
            n += 1
            yield src.parse(line, raw)


def _trace_block_tokens(sources: list[LogSource]) -> int:
    from autoresearch_dagster.logs import MOONCAKE_BLOCK_TOKENS

    return MOONCAKE_BLOCK_TOKENS if any(s.format == "mooncake" for s in sources) else CHAT_BLOCK_TOKENS


# ------------------------------------------------------------------------------------------------

def _resolve_key(key: bytes | None) -> tuple[bytes, str]:
    if key is not None:
        return key, "caller"
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode(), "env:" + KEY_ENV
    return os.urandom(32), "random-per-process"


def build_pool(logs: list[Path] | Path | str, endpoint: str, out_dir: Path | str, *, fmt: str = "auto",
               key: bytes | None = None, tokenizer_path: str | None = None,
               thresholds: FidelityThresholds | None = None, max_records: int | None = None,
               workers: int | None = None, reorder_window_s: float = 60.0, _fail_after: int | None = None) -> BuildResult:
    """Build ``out_dir`` (replay_pool.parquet, blocks.parquet for traces, fidelity/summary/quarantine files).

    Raises SpecError (nothing written) when no record was usable. ``_fail_after`` makes the build
    raise after that many rows (tests of the atomic write use it).
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
    counter_name, counter = get_counter(tokenizer_path)
    out_dir = Path(out_dir)
    if workers is None:
        total = sum(p.stat().st_size for p in paths)
        workers = min(os.cpu_count() or 1, 4) if kind == "chat" and total >= PARALLEL_MIN_BYTES else 1

    source_stats, pool_stats = WorkloadStats(), WorkloadStats()
    rejected: list[dict] = []
    reasons: Counter = Counter()
    redactions: Counter = Counter()
    window = ReorderWindow(window_s=reorder_window_s)
    rows_in = accepted = 0
    src_tokens_total = pool_tokens_total = 0
    out_sources: Counter = Counter()
    splits: Counter = Counter()
    t_first: float | None = None
    block_tokens = CHAT_BLOCK_TOKENS if kind == "chat" else _trace_block_tokens(sources)
    serving = WorkloadStats()
    sample: list[PoolRequest] = []  # trace requests whose assembled prompts are re-counted

    def reject(r: Rejected) -> None:
        rejected.append(r.to_json())
        reasons[r.reason.split(":")[0].split(" (")[0]] += 1

    with PoolWriter(out_dir) as writer:
        def emit(item: object) -> None:
            nonlocal accepted, t_first, src_tokens_total, pool_tokens_total
            if kind == "chat":
                req, src = item
            else:
                req = _trace_request(item, block_tokens, writer, key)
                src = {"prompt_tokens": item.input_length, "hashes": req.block_hashes}
            if t_first is None:
                t_first = req.arrival_s
            ts = req.arrival_s
            req.arrival_s = round(ts - t_first, 6)
            source_stats.add(ts, src["prompt_tokens"], req.output_tokens, src["hashes"], req.source_latency_s)
            pool_stats.add(req.arrival_s, req.prompt_tokens, req.output_tokens, req.block_hashes, req.source_latency_s)
            if req.split == "serving":
                serving.add(req.arrival_s, req.prompt_tokens, req.output_tokens)
            src_tokens_total += src["prompt_tokens"]
            pool_tokens_total += req.prompt_tokens
            out_sources[req.output_tokens_source] += 1
            splits[req.split] += 1
            writer.add(req)
            accepted += 1
            if kind == "trace" and (len(sample) < SYNTH_SAMPLE or accepted % 97 == 0):
                sample.append(req) if len(sample) < SYNTH_SAMPLE else sample.__setitem__(accepted % SYNTH_SAMPLE, req)
            if _fail_after is not None and accepted >= _fail_after:
                raise RuntimeError(f"injected failure after {accepted} rows")

        stream = (_chat_results(sources, key, tokenizer_path, workers, max_records, redactions) if kind == "chat"
                  else _trace_requests(sources, max_records))
        for item in stream:
            rows_in += 1
            if isinstance(item, Rejected):
                reject(item)
                continue
            if kind == "chat":
                ts, line, nbytes = item[0].arrival_s, item[1]["line"], item[1]["nbytes"]
            else:
                ts, line, nbytes = item.timestamp_s, item.line, item.nbytes
            for out in window.push(ts, line, nbytes, item):
                if isinstance(out, Rejected):
                    reject(out)
                else:
                    emit(out)
        for out in window.drain():
            emit(out)

        if accepted == 0:
            writer.abort()
            first = rejected[0]["reason"] if rejected else "no records"
            raise SpecError(f"nothing usable was read from {', '.join(map(str, paths))}: "
                            f"{len(rejected)} of {rows_in} records quarantined (first: {first})")

        extra = {}
        if kind == "chat":
            extra["redaction.prompt_token_change"] = token_change_check(src_tokens_total, pool_tokens_total, thresholds)
        if kind == "trace":
            extra["synthesis.token_count_exact"] = _synthesis_check(sample, writer, block_tokens)
        # the serving split (what replays) against the whole source
        if len(source_stats) >= thresholds.min_split_requests:
            extra["serving_split.prompt_tokens.ks"] = ks_check("serving_split.prompt_tokens.ks",
                                                                source_stats.prompt_tokens, serving.prompt_tokens,
                                                                thresholds.ks_max)
        else:
            extra["serving_split.prompt_tokens.ks"] = {
                "value": None, "threshold": thresholds.ks_max, "passed": True,
                "skipped": f"fewer than {thresholds.min_split_requests} requests"}
        fidelity = compare(source_stats, pool_stats, thresholds, extra=extra)
        elapsed = time.perf_counter() - t0
        summary = {
            "endpoint": endpoint, "logs": [str(p) for p in paths], "format": sorted({s.format for s in sources}),
            "kind": kind, "rows_in": rows_in, "rows_accepted": accepted, "rows_quarantined": len(rejected),
            "quarantine_reasons": dict(reasons.most_common()), "redactions": dict(sorted(redactions.items())),
            "prompt_tokens_source": src_tokens_total, "prompt_tokens_pool": pool_tokens_total,
            "prompt_token_change": (pool_tokens_total - src_tokens_total) / src_tokens_total if src_tokens_total else 0.0,
            "output_tokens_source": dict(out_sources), "splits": dict(splits), "token_counter": counter_name,
            "block_tokens": block_tokens, "fidelity_passed": fidelity["passed"], "build_seconds": round(elapsed, 3),
            "workers": workers,
        }
        assert summary["rows_in"] == summary["rows_accepted"] + summary["rows_quarantined"]
        meta = {"endpoint": endpoint, "token_counter": counter_name, "block_tokens": block_tokens,
                "source_format": summary["format"], "kind": kind, "redactions": summary["redactions"],
                "redaction_key_source": key_source, "rows_quarantined": len(rejected),
                "prompt_token_change": summary["prompt_token_change"], "fidelity_passed": fidelity["passed"],
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        writer.write_file("fidelity.json", json.dumps(fidelity, indent=2, default=float))
        writer.write_file("quarantine.jsonl", "".join(json.dumps(r) + "\n" for r in rejected))
        writer.write_file("summary.json", json.dumps(summary, indent=2))
        pool_path = writer.commit(meta)
    summary["content_hash"] = read_pool(pool_path).content_hash
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return BuildResult(pool_path=pool_path, fidelity=fidelity, summary=summary,
                       quarantine_path=out_dir / "quarantine.jsonl")


def _synthesis_check(sample: list[PoolRequest], writer: PoolWriter, block_tokens: int) -> dict:
    """Assemble sampled trace prompts and count them: every one must have exactly the recorded count."""
    exact = 0
    for r in sample:
        text = assemble_trace_text(r.block_hashes, r.prompt_tokens, block_tokens, r.synth_seed or 0, writer.blocks)
        exact += count_tokens(text) == r.prompt_tokens
    frac = exact / len(sample) if sample else 1.0
    check = {"value": frac, "threshold": 1.0, "passed": frac == 1.0, "sampled": len(sample)}
    if frac < 1.0:
        check["message"] = f"synthesis.token_count_exact: only {exact} of {len(sample)} assembled prompts have the recorded count"
    return check


def _trace_request(rec: LogRecord, block_tokens: int, writer: PoolWriter, key: bytes) -> PoolRequest:
    ids = rec.hash_ids or []
    for h in ids[: -(-rec.input_length // block_tokens)]:
        if not writer.has_block(h):
            writer.add_block(h, block_text_for(h, block_tokens))
    seed = int.from_bytes(hashlib.blake2b(f"{rec.line}:{rec.timestamp_s}".encode(), digest_size=8).digest(), "big") >> 1
    n_full = min(len(ids), rec.input_length // block_tokens)
    tail = rec.input_length - n_full * block_tokens
    conv = rec.conversation_id or f"line-{rec.line}"
    return PoolRequest(
        id=f"line-{rec.line}", arrival_s=rec.timestamp_s, conversation_id=rec.conversation_id, turn=None, api="chat",
        messages=None, prompt=None, tools=None, tool_choice=None, response_format=None, sampling={},
        prompt_tokens=rec.input_length, output_tokens=rec.output_length, block_hashes=list(ids),
        block_tokens=block_tokens, split=split_for(conv), output_tokens_source="recorded",
        synth_tail_tokens=tail, synth_seed=seed)


__all__ = ["BLOCKS_FILE", "POOL_FILE", "BuildResult", "build_pool", "process_chat_record"]
