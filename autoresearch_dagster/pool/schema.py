"""Owns the replay pool: its Parquet schema, the block table of trace pools, atomic writes, reading.

A pool directory holds ``replay_pool.parquet`` (one row per request, metadata in the Parquet
schema under ``autoresearch.pool``) and, for token-count trace pools, ``blocks.parquet`` (hash id
-> text of ``block_tokens`` tokens, each distinct block stored once, dictionary-coded as ids into
a bank of eight-token phrases that the file's metadata carries). Trace prompts are assembled
when a request is read: the leading blocks from the block table, then a per-request tail of
synthesized text, so a long trace stays tens of MB on disk.

Building a pool from logs (read, redact, synthesize, check fidelity) is ``pool.build.build_pool``.
"""
from __future__ import annotations

import hashlib
import json
from array import array
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Iterable, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from autoresearch_dagster.spec import SpecError
from autoresearch_dagster.tokens import synth_text

POOL_FILE = "replay_pool.parquet"
BLOCKS_FILE = "blocks.parquet"
META_KEY = b"autoresearch.pool"
SCHEMA_VERSION = 1
SPLIT_TRAINING_PERCENT = 10  # conversations hashed into the training split; the rest serve replay

# One row per request. Columns beyond the list, and why:
#   api / prompt / tool_choice_json: completions requests and tool_choice must replay as logged;
#   output_tokens_source: which of usage / max_tokens / estimate / recorded gave output_tokens;
#   synth_tail_tokens / synth_seed: trace pools only, the unique tail appended after the blocks;
#   source_latency_s: recorded end-to-end latency when the log has timings (concurrency check).
POOL_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("arrival_s", pa.float64()),
    ("conversation_id", pa.string()),
    ("turn", pa.int32()),
    ("api", pa.string()),
    ("messages_json", pa.string()),
    ("prompt", pa.string()),
    ("tools_json", pa.string()),
    ("tool_choice_json", pa.string()),
    ("response_format_json", pa.string()),
    ("sampling_json", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("output_tokens", pa.int32()),
    ("output_tokens_source", pa.string()),
    ("block_hashes", pa.list_(pa.int64())),
    ("split", pa.string()),
    ("synth_tail_tokens", pa.int32()),
    ("synth_seed", pa.int64()),
    ("source_latency_s", pa.float64()),
])
PHRASES_KEY = b"autoresearch.phrases"


@dataclass
class PoolRequest:
    id: str
    arrival_s: float
    conversation_id: str | None
    turn: int | None
    api: Literal["chat", "completions"]
    messages: list[dict] | None
    prompt: str | None
    tools: list[dict] | None
    tool_choice: Any
    response_format: dict | None
    sampling: dict
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[int]
    block_tokens: int
    split: Literal["serving", "training"]
    output_tokens_source: str = "recorded"
    source_latency_s: float | None = None
    synth_tail_tokens: int | None = None  # trace pools: tokens synthesized after the shared blocks
    synth_seed: int | None = None

    def body(self) -> dict:
        """OpenAI request body; the runner sets model, stream and max_tokens."""
        body: dict[str, Any] = {}
        if self.api == "chat":
            body["messages"] = self.messages or []
        else:
            body["prompt"] = self.prompt or ""
        if self.tools:
            body["tools"] = self.tools
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.response_format is not None:
            body["response_format"] = self.response_format
        for k, v in self.sampling.items():
            if k not in ("max_tokens", "max_completion_tokens", "stream", "model"):
                body[k] = v
        return body


def split_for(conversation_key: str) -> Literal["serving", "training"]:
    """Deterministic 90/10 split by conversation, so a conversation never straddles the two."""
    h = int.from_bytes(hashlib.blake2b(conversation_key.encode(), digest_size=8).digest(), "big")
    return "training" if h % 100 < SPLIT_TRAINING_PERCENT else "serving"


def _dumps(obj: Any) -> str | None:
    return None if obj is None else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def request_to_row(r: PoolRequest) -> dict:
    synthesized = r.synth_tail_tokens is not None
    return {
        "id": r.id, "arrival_s": float(r.arrival_s), "conversation_id": r.conversation_id, "turn": r.turn,
        "api": r.api,
        "messages_json": None if synthesized else _dumps(r.messages),
        "prompt": None if synthesized else r.prompt,
        "tools_json": _dumps(r.tools), "tool_choice_json": _dumps(r.tool_choice),
        "response_format_json": _dumps(r.response_format), "sampling_json": _dumps(r.sampling or {}),
        "prompt_tokens": int(r.prompt_tokens), "output_tokens": int(r.output_tokens),
        "output_tokens_source": r.output_tokens_source, "block_hashes": [int(h) for h in r.block_hashes],
        "split": r.split, "synth_tail_tokens": r.synth_tail_tokens, "synth_seed": r.synth_seed,
        "source_latency_s": r.source_latency_s,
    }


def assemble_trace_text(hash_ids: list[int], prompt_tokens: int, block_tokens: int, tail_seed: int,
                        block_text: Mapping[int, str]) -> str:
    """Prompt text with exactly ``prompt_tokens`` approx tokens and the recorded prefix structure.

    Full blocks come from the block table; when the recorded length ends inside the last listed
    block, that block's leading tokens are used (so requests sharing it still share a prefix);
    tokens beyond the listed blocks are a per-request synthesized tail.
    """
    n_full = min(len(hash_ids), prompt_tokens // block_tokens)
    parts = [block_text[h] for h in hash_ids[:n_full]]
    rest = prompt_tokens - n_full * block_tokens
    if rest > 0:
        if n_full < len(hash_ids):
            # synth_text blocks are " w1 w2 ..." with one token per word: cut at the rest-th word
            words = block_text[hash_ids[n_full]].split(" ")[1:rest + 1]
            parts.append("".join(" " + w for w in words))
        else:
            parts.append(synth_text(rest, tail_seed))
    return "".join(parts)


PHRASE_WORDS = 8
# The phrase bank trace blocks are made of: 512 eight-token phrases (" word" x 8). blocks.parquet
# stores each block as its phrase ids and carries this bank in its metadata, so the file alone
# decodes to text; the encoding keeps a one-hour trace's block table tens of MB instead of GB.
PHRASES = tuple(synth_text(PHRASE_WORDS, seed=1_000_003 + i) for i in range(512))
_MASK64 = 2**64 - 1


def mix64(x: int) -> int:
    """splitmix64: a uniform 64-bit hash of an integer (scalar twin of ``mix64_np``)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def mix64_np(x: np.ndarray) -> np.ndarray:
    """splitmix64 over an integer array (int64 or uint64 bits), as uint64 with wrapping arithmetic."""
    with np.errstate(over="ignore"):
        z = np.asarray(x).astype(np.int64).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def block_phrase_ids(hash_ids: np.ndarray, block_tokens: int) -> np.ndarray:
    """Phrase ids (n, ceil(block_tokens / 8)) of blocks: an independent hash stream per block id.

    Each 64-bit hash gives seven 9-bit phrase ids.
    """
    k = -(-block_tokens // PHRASE_WORDS)
    n_words = -(-k // 7)
    with np.errstate(over="ignore"):
        base = mix64_np(hash_ids)
        j = (np.arange(n_words, dtype=np.uint64) + np.uint64(1)) * np.uint64(0xD1B54A32D192ED03)
        words = mix64_np(base[:, None] ^ j[None, :])
        shifts = np.arange(7, dtype=np.uint64) * np.uint64(9)
        ids = (words[:, :, None] >> shifts[None, None, :]) & np.uint64(len(PHRASES) - 1)
        return ids.reshape(len(base), n_words * 7)[:, :k].astype(np.uint16)


def phrases_to_text(ids, block_tokens: int, phrases=PHRASES) -> str:
    """Decode one block: whole phrases, then the first (block_tokens mod 8) words of one more."""
    full, rest = divmod(block_tokens, PHRASE_WORDS)
    text = "".join([phrases[i] for i in ids[:full]])
    if rest:
        text += "".join(" " + w for w in phrases[ids[full]].split(" ")[1:rest + 1])
    return text


def block_text_for(hash_id: int, block_tokens: int) -> str:
    """The synthesized text of one trace block: exactly ``block_tokens`` approx tokens, a function of the id."""
    return phrases_to_text(block_phrase_ids(np.array([hash_id]), block_tokens)[0].tolist(), block_tokens)


class BlockTable(Mapping):
    """hash id -> block text, decoded from blocks.parquet on access (and cached)."""

    def __init__(self, path: Path | None, block_tokens: int):
        self.block_tokens = block_tokens
        self._rows: dict[int, int] = {}
        self._ids = None
        self._phrases = PHRASES
        self._cache: dict[int, str] = {}
        if path is not None and path.exists():
            t = pq.read_table(path)
            raw = (pq.read_metadata(path).metadata or {}).get(PHRASES_KEY)
            if raw:
                self._phrases = tuple(json.loads(raw))
            self._ids = t.column("phrase_ids").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)
            self._rows = {h: i for i, h in enumerate(t.column("hash_id").to_pylist())}

    def __getitem__(self, h: int) -> str:
        text = self._cache.get(h)
        if text is None:
            text = phrases_to_text(self._ids[self._rows[h]].tolist(), self.block_tokens, self._phrases)
            self._cache[h] = text
        return text

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


class _ContentHash:
    """Hash of a pool's rows that does not depend on how they were batched: one running hash per column."""

    def __init__(self) -> None:
        self._cols: dict[str, "hashlib._Hash"] = {}

    def _h(self, key: str) -> "hashlib._Hash":
        if key not in self._cols:
            self._cols[key] = hashlib.sha256()
        return self._cols[key]

    def update(self, table: pa.Table) -> None:
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            if pa.types.is_list(col.type):
                self._h(name + ":len").update(pc.list_value_length(col).fill_null(-1).to_numpy().astype(np.int64).tobytes())
                self._h(name).update(pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
            elif (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)) and col.null_count == 0:
                self._h(name).update(col.to_numpy().astype(np.float64 if pa.types.is_floating(col.type)
                                                            else np.int64).tobytes())
            elif pa.types.is_string(col.type):  # lengths (-1 for null) + the concatenated bytes
                self._h(name + ":len").update(pc.binary_length(col).fill_null(-1).to_numpy().astype(np.int64).tobytes())
                offs = np.frombuffer(col.buffers()[1], dtype=np.int32, count=len(col) + 1, offset=col.offset * 4)
                data = col.buffers()[2]
                if data is not None and offs[-1] > offs[0]:
                    self._h(name).update(memoryview(data)[int(offs[0]):int(offs[-1])])
            else:  # nullable numbers
                self._h(name + ":null").update(col.is_null().to_numpy(zero_copy_only=False).tobytes())
                self._h(name).update(col.fill_null(0).to_numpy().astype(np.float64).tobytes())

    def digest(self, extra: bytes = b"") -> str:
        h = hashlib.sha256()
        for key in sorted(self._cols):
            h.update(key.encode() + b"=" + self._cols[key].digest())
        h.update(extra)
        return h.hexdigest()


# what a pool directory holds (its home adds source.json): anything else in a directory means it is not a pool
_POOL_FILES = {POOL_FILE, BLOCKS_FILE, "fidelity.json", "quarantine.jsonl", "summary.json", "source.json"}
DIR_MODE, FILE_MODE = 0o755, 0o644  # a pool is readable by the group and others (mkdtemp makes 0700)
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _owner_gone(name: str) -> bool:
    """Whether the build that made temp dir ``name`` (``….<kind>-<host>-<pid>-…``) is no longer running here."""
    parts = name.rsplit("-", 3)
    if len(parts) != 4 or parts[1] != _HOST or not parts[2].isdigit():
        return False  # another host's build, or not ours to judge
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, owned by another user
        return False
    return False


def sweep_stale(out_dir: Path) -> list[Path]:
    """Remove what killed builds of ``out_dir`` left beside it; a previous pool parked mid-swap is put back.

    A build's temp dir is named ``.NAME.tmp-HOST-PID-…`` and its parked previous pool
    ``.NAME.old-HOST-PID-…``, so a later build on the same host can tell that the process is gone
    (SIGKILL, a crash of the machine); the temp dirs of a live build are left alone."""
    removed = []
    if not out_dir.parent.is_dir():
        return removed
    for kind in ("old", "tmp"):  # parked pools first: put back before anything is deleted
        for d in sorted(out_dir.parent.glob(f".{out_dir.name}.{kind}-{_HOST}-*")):
            if not d.is_dir() or not _owner_gone(d.name):
                continue
            parked = d / out_dir.name
            if kind == "old" and parked.is_dir() and not out_dir.exists():
                os.replace(parked, out_dir)
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


class PoolWriter:
    """Streams rows into a temp dir beside ``out_dir``; ``commit`` swaps it in with ``os.replace``.

    Until ``commit`` nothing exists at ``out_dir`` that was not there before; ``abort`` (or an
    exception inside a ``with`` block, SIGTERM included through the CLI) removes the temp dir, so a
    failed build leaves no pool; what a killed build left is swept by the next one (``sweep_stale``).
    The pool directory gets mode 0755 and its files 0644.
    """

    def __init__(self, out_dir: str | Path, *, row_group_rows: int = 65536):
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise SpecError(f"pool directory {self.out_dir} is a file; give a directory (it is created when missing)")
        if self.out_dir.is_dir() and any(f.name not in _POOL_FILES for f in self.out_dir.iterdir()) \
                and not (self.out_dir / POOL_FILE).exists():
            # the swap replaces the whole directory: never one that holds something else
            raise SpecError(f"pool directory {self.out_dir} holds files but no replay pool; it would be replaced "
                            "whole: give a new or empty directory")
        if self.out_dir.parent.exists() and not self.out_dir.parent.is_dir():
            raise SpecError(f"{self.out_dir.parent} is a file, not a directory for the pool {self.out_dir.name}")
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(self.out_dir)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.tmp-{_HOST}-{os.getpid()}-",
                                         dir=self.out_dir.parent))
        self._rows: list[dict] = []
        self._tables: list[pa.Table] = []
        self._table_rows = 0
        self._row_group_rows = row_group_rows
        self._writer: pq.ParquetWriter | None = None
        self._hash = _ContentHash()
        self.n_rows = 0
        self._block_ids: set[int] = set()

    def __enter__(self) -> "PoolWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def add(self, req: PoolRequest) -> None:
        self.add_row(request_to_row(req))

    def add_row(self, row: dict) -> None:
        """Add one row in ``request_to_row`` shape (nested values already JSON strings)."""
        self._rows.append(row)
        self.n_rows += 1
        if len(self._rows) >= 4096:  # chat rows are large: smaller row groups keep memory bounded
            self._flush()

    def add_table(self, table: pa.Table) -> None:
        """Add a batch of rows already in POOL_SCHEMA (the fast path for token-count traces)."""
        self._flush()
        self.n_rows += table.num_rows
        self._tables.append(table)
        self._table_rows += table.num_rows
        if self._table_rows >= self._row_group_rows:
            self._flush()

    def add_block(self, hash_id: int) -> None:
        """Register a trace block; its text (``block_text_for``) is written once, at commit."""
        self._block_ids.add(hash_id)

    def add_blocks(self, hash_ids: Iterable[int]) -> None:
        self._block_ids.update(hash_ids)

    def _write_table(self, table: pa.Table) -> None:
        self._hash.update(table)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.tmp / POOL_FILE, POOL_SCHEMA, compression="zstd")
        self._writer.write_table(table, row_group_size=max(4096, table.num_rows))

    def _flush(self) -> None:
        if self._rows:
            self._write_table(pa.Table.from_pylist(self._rows, schema=POOL_SCHEMA))
            self._rows = []
        if self._tables:
            self._write_table(pa.concat_tables(self._tables).combine_chunks())
            self._tables, self._table_rows = [], 0

    def content_hash(self, block_tokens: int) -> str:
        """Hash of the rows (flushed first) and, for trace pools, the block table's ids and block size."""
        self._flush()
        extra = b""
        if self._block_ids:  # block text is a function of (id, block_tokens): hashing both covers it
            extra = f"blocks:{block_tokens}:".encode() + array("q", sorted(self._block_ids)).tobytes()
        return self._hash.digest(extra)

    def write_file(self, name: str, data: str | bytes) -> Path:
        path = self.tmp / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path

    def commit(self, meta: dict) -> Path:
        """Finish the Parquet files (metadata included) and atomically move the directory into place."""
        self._flush()
        block_tokens = int(meta.get("block_tokens", 64))
        meta = {**meta, "schema_version": SCHEMA_VERSION, "rows": self.n_rows,
                "blocks": len(self._block_ids), "content_hash": self.content_hash(block_tokens)}
        if self._writer is None:
            self._write_table(pa.Table.from_pylist([], schema=POOL_SCHEMA))
        self._writer.add_key_value_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
        self._writer.close()
        self._writer = None
        if self._block_ids:
            ids = np.array(sorted(self._block_ids), dtype=np.int64)
            k = -(-block_tokens // PHRASE_WORDS)
            schema = pa.schema([("hash_id", pa.int64()), ("phrase_ids", pa.list_(pa.uint16(), k))],
                               metadata={PHRASES_KEY: json.dumps(PHRASES).encode(),
                                         b"block_tokens": str(block_tokens).encode()})
            with pq.ParquetWriter(self.tmp / BLOCKS_FILE, schema, compression="zstd") as bw:
                for i in range(0, len(ids), 65536):  # streamed: memory bounded by one chunk
                    chunk = ids[i:i + 65536]
                    phr = pa.FixedSizeListArray.from_arrays(pa.array(block_phrase_ids(chunk, block_tokens).ravel()), k)
                    bw.write_table(pa.Table.from_arrays([pa.array(chunk), phr], schema=schema))
        os.chmod(self.tmp, DIR_MODE)
        for f in self.tmp.iterdir():
            os.chmod(f, FILE_MODE)
        final = self.out_dir
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-{_HOST}-{os.getpid()}-", dir=final.parent))
            os.replace(final, old / final.name)
            os.replace(self.tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, final)
        return final / POOL_FILE

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 — already failing; the temp dir is removed regardless
                pass
            self._writer = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def write_pool(rows: Iterable[PoolRequest], out_dir: str | Path, meta: dict | None = None) -> Path:
    """Write requests as a pool directory (atomically); returns the path of ``replay_pool.parquet``.

    Trace-style requests (``synth_tail_tokens`` set) get their blocks added to ``blocks.parquet``.
    """
    meta = dict(meta or {})
    block_tokens = None
    with PoolWriter(out_dir) as w:
        for r in rows:
            block_tokens = block_tokens or r.block_tokens
            if r.synth_tail_tokens is not None:
                for h in r.block_hashes:
                    w.add_block(h)
            w.add(r)
        meta.setdefault("block_tokens", block_tokens or 64)
        meta.setdefault("token_counter", "approx-regex-v1")
        return w.commit(meta)


class ReplayPool:
    """A pool read back from disk; requests are materialized (and trace prompts assembled) on access."""

    def __init__(self, path: Path, table: pa.Table, meta: dict):
        self.path = path
        self.meta = meta
        self._table = table
        self._cols = {name: table.column(name).to_pylist() for name in table.column_names}
        self._blocks: BlockTable | None = None
        self.block_tokens = int(meta.get("block_tokens", 64))

    @property
    def blocks(self) -> BlockTable:
        """The block table (hash id -> text), read from blocks.parquet on first use."""
        if self._blocks is None:
            f = self.path.parent / BLOCKS_FILE
            self._blocks = BlockTable(f if f.exists() else None, self.block_tokens)
        return self._blocks

    def __len__(self) -> int:
        return self._table.num_rows

    @property
    def table(self) -> pa.Table:
        return self._table

    @property
    def content_hash(self) -> str:
        return str(self.meta["content_hash"])

    def request(self, i: int) -> PoolRequest:
        c = self._cols
        tail = c["synth_tail_tokens"][i]
        hashes = list(c["block_hashes"][i] or [])
        messages = _loads(c["messages_json"][i])
        if tail is not None:
            text = assemble_trace_text(hashes, c["prompt_tokens"][i], self.block_tokens,
                                       c["synth_seed"][i] or 0, self.blocks)
            messages = [{"role": "user", "content": text}]
        return PoolRequest(
            id=c["id"][i], arrival_s=c["arrival_s"][i], conversation_id=c["conversation_id"][i],
            turn=c["turn"][i], api=c["api"][i], messages=messages, prompt=c["prompt"][i],
            tools=_loads(c["tools_json"][i]), tool_choice=_loads(c["tool_choice_json"][i]),
            response_format=_loads(c["response_format_json"][i]), sampling=_loads(c["sampling_json"][i]) or {},
            prompt_tokens=c["prompt_tokens"][i], output_tokens=c["output_tokens"][i],
            block_hashes=hashes, block_tokens=self.block_tokens, split=c["split"][i],
            output_tokens_source=c["output_tokens_source"][i], source_latency_s=c["source_latency_s"][i],
            synth_tail_tokens=tail, synth_seed=c["synth_seed"][i],
        )

    def iter_requests(self, split: str | None = "serving") -> Iterator[PoolRequest]:
        splits = self._cols["split"]
        for i in range(len(self)):
            if split is None or splits[i] == split:
                yield self.request(i)

    def column(self, name: str) -> list:
        return self._cols[name]


def read_pool(path: str | Path) -> ReplayPool:
    """Open a pool from its directory or its ``replay_pool.parquet``."""
    p = Path(path)
    file = p / POOL_FILE if p.is_dir() else p
    if not file.exists():
        raise FileNotFoundError(f"no replay pool at {file}")
    if not file.is_file():
        raise FileNotFoundError(f"no replay pool at {file} (a directory, not a Parquet file)")
    try:
        table = pq.read_table(file)
        raw = (pq.read_metadata(file).metadata or {}).get(META_KEY)
    except pa.ArrowInvalid as e:
        raise SpecError(f"{file} is not a replay pool (not a readable Parquet file: {e})") from None
    meta = json.loads(raw) if raw else {}
    return ReplayPool(file, table, meta)
