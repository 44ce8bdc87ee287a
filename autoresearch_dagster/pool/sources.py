"""Owns a pool's source: an endpoint's log files, their fingerprint, and building or reusing the pool in its home.

The home of an endpoint's pool is ``ResultsLake.pool_dir(endpoint)`` (``<lake>/_pools/<endpoint>``)
for the CLI and the Dagster asset alike: the lake is the one store both sides share by default
(``out/lake``), and a campaign, recorded in that lake, names its pool by content hash, so keeping
the pool beside those rows lets a CLI noise run and the loop's assets replay the same pool.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.pool.build import build_pool
from autoresearch_dagster.pool.production import PRODUCTION_FILE
from autoresearch_dagster.pool.redact import KEY_ENV
from autoresearch_dagster.pool.schema import SCHEMA_VERSION, ReplayPool, read_pool

SOURCE_FILE = "source.json"  # in a pool's home: the fingerprint of what it was built from


def log_files(paths: Iterable[Path]) -> list[Path]:
    """The files named by ``paths`` (an endpoint's ``workload.logs``), directories expanded, in a stable order."""
    files: list[Path] = []
    for p in paths:
        files += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return files


def log_fingerprint(files: Iterable[Path]) -> list[dict[str, Any]]:
    """Each file's absolute path, size and mtime (None when missing).

    A new, grown, replaced or removed file changes it."""
    out = []
    for p in files:
        st = p.stat() if p.exists() else None
        out.append({"path": str(p.resolve()), "size": st.st_size if st else None,
                    "mtime_ns": st.st_mtime_ns if st else None})
    return out


def fingerprint_digest(fingerprint: Any) -> str:
    """A short stable digest of a fingerprint (sensor cursors and run keys carry it)."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def pool_source(files: list[Path], fmt: str, tokenizer_path: str | None = None) -> dict[str, Any]:
    """What a pool built from ``files`` depends on besides the redaction key: the logs' fingerprint, the
    reader format, the tokenizer and the pool schema version. Equal sources => the same pool rows."""
    return {"logs": log_fingerprint(files), "format": fmt,
            "tokenizer": str(Path(tokenizer_path).resolve()) if tokenizer_path else None,
            "pool_schema_version": SCHEMA_VERSION}


@dataclass
class SourcedPool:
    pool: ReplayPool
    home: Path
    summary: dict  # the build's summary.json
    reused: bool


def ensure_pool(files: list[Path], endpoint: str, home: Path, *, fmt: str, key: bytes | None = None,
                tokenizer_path: str | None = None, say: Callable[[str], None] = print) -> SourcedPool:
    """The pool in ``home`` if it was built from the same source, else a new build there.

    Without a redaction key (``key`` or AUTORESEARCH_REDACTION_KEY) each build redacts under a fresh
    random key, so two builds of the same logs differ (and so would their campaigns); reusing the
    earlier build keeps one campaign. With a key, the pool is rebuilt (deterministic under the key,
    and a pool made under another key must not stand in for it). Only the source is stored, never
    anything derived from a key.
    """
    home = Path(home)
    source = pool_source(files, fmt, tokenizer_path)
    stamp = home / SOURCE_FILE
    # a pool built before production timelines were kept (pool.production) is rebuilt
    if key is None and not os.environ.get(KEY_ENV) and stamp.exists() and (home / PRODUCTION_FILE).exists():
        try:
            if json.loads(stamp.read_text()) == source:
                pool = read_pool(home)
                summary = json.loads((home / "summary.json").read_text())
                say(f"reusing replay pool {home} (built from the same, unchanged logs)")
                return SourcedPool(pool, home, summary, reused=True)
        except (OSError, ValueError) as e:
            say(f"rebuilding replay pool {home}: the earlier build is unreadable ({type(e).__name__})")
    built = build_pool(files, endpoint, home, fmt=fmt, key=key, tokenizer_path=tokenizer_path)
    write_json(stamp, source, sort_keys=True)  # after the build is in place: a build cut short is never reused
    say(f"built replay pool {home} from {len(files)} log file(s)")
    return SourcedPool(read_pool(built.pool_path), home, built.summary, reused=False)
