"""Strict inputs of a pool build: every bad record gets its reason in the quarantine, nothing is lost or left over.

Timestamp outliers and the timeline's limits, repeated request ids, Mooncake records without hash_ids,
prompts longer than the model's context, file modes, and what killed builds leave behind.
"""
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from autoresearch_dagster.logs import TimelineLimits
from autoresearch_dagster.pool.build import build_pool
from autoresearch_dagster.pool.schema import read_pool, sweep_stale
from autoresearch_dagster.spec import SpecError

from .conftest import ROOT, chat_line, write_lines

T0 = 1772442000.0  # 2026-03-02
Y2099 = 4083235200.0


def _quarantine(res) -> dict[int, str]:
    return {r["line"]: r["reason"] for r in map(json.loads, res.quarantine_path.read_text().splitlines())}


def _reconciled(s: dict) -> bool:
    return s["rows_in"] == s["rows_accepted"] + s["rows_quarantined"] == s["rows_accepted"] + sum(
        s["quarantine_reasons"].values())


def _mooncake(path, rows):
    return write_lines(path, [r if isinstance(r, str) else json.dumps(r) for r in rows])


def test_a_2099_record_is_quarantined_and_the_pool_spans_the_rest(tmp_path):
    lines = [chat_line(T0 + 10 * i) for i in range(60)]
    lines[30] = chat_line(Y2099)  # a typo'd year in the middle of the log
    lines[0] = chat_line(1e300)  # and an absurd first record
    res = build_pool([write_lines(tmp_path / "l.jsonl", lines)], "t", tmp_path / "pool", key=b"k", workers=1)
    s = res.summary
    assert s["rows_accepted"] == 58 and s["quarantine_reasons"] == {"timestamp outlier": 2} and _reconciled(s)
    q = _quarantine(res)
    assert set(q) == {1, 31}
    assert "4083235200 (2099-05-23 16:00:00 UTC)" in q[31] and "the largest gap allowed is 7 days" in q[31]
    assert "1e+291" in q[1]  # 1e300 read as nanoseconds
    pool = read_pool(res.pool_path)
    arrivals = sorted(r.arrival_s for r in pool.iter_requests(None))
    assert arrivals[0] == 0.0 and arrivals[-1] == 590.0 - 10.0  # lines 2..60 without line 31: T0+10 .. T0+590
    assert s["timeline"]["span_s"] == 580.0 and s["timeline"]["max_span_s"] == 31 * 86400


def test_timeline_limits_quarantine_what_lies_beyond_them(tmp_path):
    day = 86400.0
    lines = [chat_line(T0 + i * 3600) for i in range(48)]  # two days, hourly
    lines += [chat_line(T0 + 10 * day + i) for i in range(3)]  # after a pause of 8 days
    limits = TimelineLimits(max_span_s=1.5 * day, max_gap_s=0.5 * day, probe_records=10)
    res = build_pool([write_lines(tmp_path / "l.jsonl", lines)], "t", tmp_path / "pool", key=b"k", workers=1,
                     timeline=limits)
    s, q = res.summary, _quarantine(res)
    assert s["quarantine_reasons"] == {"timestamp beyond the span limit": 11, "timestamp outlier": 3}
    assert all("the longest span allowed is 1.5 days" in q[n] for n in range(38, 49))
    assert all("after the timeline so far" in q[n] for n in range(49, 52))
    assert s["timeline"]["span_s"] == 36 * 3600.0 and _reconciled(s)


def test_trace_outliers_are_the_same_through_the_bulk_and_the_line_readers(tmp_path):
    rows = [{"timestamp": 1000 * i, "input_length": 700, "output_length": 5, "hash_ids": [i % 7, 100 + i]}
            for i in range(3000)]
    rows[0]["timestamp"] = 1e300  # milliseconds: 1e297 s
    rows[1700]["timestamp"] = 40 * 86400 * 1000
    log = _mooncake(tmp_path / "t.jsonl", rows)
    a = build_pool([log], "t", tmp_path / "a", workers=1, bulk=True)
    b = build_pool([log], "t", tmp_path / "b", workers=1, bulk=False)
    for res in (a, b):
        assert res.summary["quarantine_reasons"] == {"timestamp outlier": 2} and _reconciled(res.summary)
        assert set(_quarantine(res)) == {1, 1701}
        assert res.summary["timeline"]["span_s"] == 2998.0
    assert _quarantine(a) == _quarantine(b) and a.summary["content_hash"] == b.summary["content_hash"]


def test_repeated_request_ids_are_counted_and_quarantined_keeping_the_first(tmp_path):
    rid = "alice@example.com-7"  # ids may be personal: never written out
    lines = [chat_line(T0, request_id=rid), chat_line(T0 + 1, request_id="b"), chat_line(T0 + 2, request_id=rid),
             chat_line(T0 + 3), chat_line(T0 + 4), chat_line(T0 + 5, request_id=rid)]
    res = build_pool([write_lines(tmp_path / "l.jsonl", lines)], "t", tmp_path / "pool", key=b"k", workers=1)
    s = res.summary
    assert s["duplicate_request_ids"] == 2 and s["quarantine_reasons"] == {"duplicate request id": 2}
    assert _quarantine(res) == {3: "duplicate request id: first seen on line 1",
                                6: "duplicate request id: first seen on line 1"}
    assert s["rows_accepted"] == 4 and _reconciled(s)
    for f in (tmp_path / "pool").iterdir():
        assert b"alice" not in f.read_bytes()


def test_repeated_ids_across_log_files_are_caught_too(tmp_path):
    a = write_lines(tmp_path / "a.jsonl", [chat_line(T0 + i, request_id=f"r{i}") for i in range(5)])
    b = write_lines(tmp_path / "b.jsonl", [chat_line(T0 + 3 + i, request_id=f"r{i + 3}") for i in range(5)])
    res = build_pool([a, b], "t", tmp_path / "pool", key=b"k", workers=1)
    assert res.summary["duplicate_request_ids"] == 2 and res.summary["rows_accepted"] == 8


@pytest.mark.parametrize("bulk", [True, False])
def test_a_mooncake_record_without_hash_ids_is_quarantined(tmp_path, bulk):
    rows = [{"timestamp": 10 * i, "input_length": 600, "output_length": 5, "hash_ids": [i, i + 1]} for i in range(20)]
    del rows[4]["hash_ids"]
    rows[9]["hash_ids"] = None
    res = build_pool([_mooncake(tmp_path / "t.jsonl", rows)], "t", tmp_path / "pool", workers=1, bulk=bulk)
    q = _quarantine(res)
    assert q == {5: "missing field 'hash_ids'", 10: "field 'hash_ids' must be a list of non-negative integers"}
    assert res.summary["rows_accepted"] == 18 and _reconciled(res.summary)


def test_prompts_longer_than_the_context_are_quarantined(tmp_path):
    long_text = " ".join(["word"] * 3000)
    lines = [chat_line(T0 + i) for i in range(5)] + [chat_line(T0 + 5, content=long_text)]
    res = build_pool([write_lines(tmp_path / "l.jsonl", lines)], "t", tmp_path / "pool", key=b"k", workers=1,
                     context_length=2048)
    q = _quarantine(res)
    assert list(q) == [6] and q[6].startswith("prompt longer than the model's context: ")
    assert "the context holds 2048" in q[6] and res.summary["context_length"] == 2048

    rows = [{"timestamp": 10 * i, "input_length": 1000 * (i + 1), "output_length": 5, "hash_ids": [i]}
            for i in range(6)]
    log = _mooncake(tmp_path / "t.jsonl", rows)
    for bulk in (True, False):
        res = build_pool([log], "t", tmp_path / f"trace{bulk}", workers=1, bulk=bulk, context_length=4000)
        q = _quarantine(res)
        assert set(q) == {4, 5, 6} and "4000 tokens, the context holds 4000" in q[4]
        assert res.summary["rows_accepted"] == 3 and _reconciled(res.summary)


def test_the_pool_is_readable_by_the_group_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        res = build_pool([write_lines(tmp_path / "l.jsonl", [chat_line(T0 + i) for i in range(5)])], "t",
                         tmp_path / "pool", key=b"k", workers=1)
    finally:
        os.umask(old)
    pool_dir = res.pool_path.parent
    assert stat.S_IMODE(pool_dir.stat().st_mode) == 0o755
    files = list(pool_dir.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o644 for f in files)


def test_a_directory_that_is_not_a_pool_is_never_replaced(tmp_path):
    log = write_lines(tmp_path / "l.jsonl", [chat_line(T0 + i) for i in range(5)])
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="holds files but no replay pool"):
        build_pool([log], "t", keep, workers=1)
    with pytest.raises(SpecError, match="is a file"):
        build_pool([log], "t", keep / "notes.txt", workers=1)
    assert (keep / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.jsonl", "mine"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_what_a_killed_build_left_is_swept_and_a_parked_pool_put_back(tmp_path):
    from autoresearch_dagster.pool import schema

    log = write_lines(tmp_path / "l.jsonl", [chat_line(T0 + i) for i in range(5)])
    first = build_pool([log], "t", tmp_path / "pool", key=b"k", workers=1)
    h = read_pool(first.pool_path).content_hash
    dead = _dead_pid()
    # killed mid-swap: the previous pool parked in .pool.old-…, the new one still in .pool.tmp-…
    old = tmp_path / f".pool.old-{schema._HOST}-{dead}-abc"
    old.mkdir()
    os.replace(tmp_path / "pool", old / "pool")
    (tmp_path / f".pool.tmp-{schema._HOST}-{dead}-def").mkdir()
    live = tmp_path / f".pool.tmp-{schema._HOST}-{os.getpid()}-ghi"  # a build still running: left alone
    live.mkdir()
    other_host = tmp_path / f".pool.tmp-0000zzzz-{dead}-jkl"
    other_host.mkdir()
    assert len(sweep_stale(tmp_path / "pool")) == 2
    assert read_pool(tmp_path / "pool").content_hash == h
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["l.jsonl", "pool", live.name, other_host.name])


def _default_sigterm() -> None:
    """The child starts with SIGTERM's default: an ignored SIGTERM is inherited across exec, and a Dagster run in
    this process maps SIGTERM to SIGINT's disposition (dagster._utils.interrupts), which a shell's background job
    ignores; the CLI then rightly leaves the ignore alone and the build runs to its end."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_sigterm_during_a_build_removes_its_temp_dir(tmp_path):
    log = write_lines(tmp_path / "big.jsonl", [chat_line(T0 + i * 0.01, content=f"message {i} " * 40)
                                               for i in range(40000)])
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch_dagster", "pool", "build", "--logs", str(log),
                             "--endpoint", "t", "--out", str(tmp_path / "pool"), "--workers", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigterm)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".pool.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the build ended before it could be interrupted"
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (out.decode()[-1500:], err.decode()[-1500:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]
