"""A pool's log source: the one fingerprint of the log files and the build-or-reuse rule of the pool home."""
from __future__ import annotations

import json
import os

from autoresearch_dagster.pool.redact import KEY_ENV
from autoresearch_dagster.pool.sources import (SOURCE_FILE, ensure_pool, fingerprint_digest, log_fingerprint,
                                               log_files)

from .conftest import chat_line, write_lines


def _bump_mtime(path):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_fingerprint_expands_directories_and_changes_with_any_file(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    a = write_lines(logs / "a.jsonl", [chat_line(1.0)])
    b = write_lines(logs / "b.jsonl", [chat_line(2.0)])
    files = log_files([logs])
    assert files == [a, b]
    before = fingerprint_digest(log_fingerprint(files))
    assert fingerprint_digest(log_fingerprint(log_files([logs]))) == before  # stable
    _bump_mtime(b)
    assert fingerprint_digest(log_fingerprint(files)) != before
    b.unlink()
    gone = log_fingerprint(files)
    assert gone[1] == {"path": str(b.resolve()), "size": None, "mtime_ns": None}


def test_the_home_is_reused_while_the_logs_are_unchanged_and_rebuilt_with_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    log = write_lines(tmp_path / "chat.jsonl", [chat_line(float(i), f"question number {i}") for i in range(30)])
    home = tmp_path / "lake" / "_pools" / "ep"
    said: list[str] = []
    first = ensure_pool([log], "ep", home, fmt="auto", say=said.append)
    assert not first.reused and said[-1].startswith("built replay pool")
    stamp = json.loads((home / SOURCE_FILE).read_text())
    assert stamp["logs"] == log_fingerprint([log])
    again = ensure_pool([log], "ep", home, fmt="auto", say=said.append)
    assert again.reused and again.pool.content_hash == first.pool.content_hash
    assert again.summary["rows_accepted"] == first.summary["rows_accepted"] == 30
    _bump_mtime(log)
    assert not ensure_pool([log], "ep", home, fmt="auto", say=said.append).reused
    assert not ensure_pool([log], "ep", home, fmt="auto", key=b"secret-key-7f3a", say=said.append).reused
    assert b"secret-key-7f3a" not in (home / SOURCE_FILE).read_bytes()
