import json

from autoresearch_dagster.pool.schema import read_pool
from autoresearch_dagster.pool.build import build_pool
from .conftest import ROOT, chat_line, write_lines

SECRET = "carol.secret@example.com"


def test_every_bad_kind_is_quarantined_and_counts_reconcile(tmp_path):
    lines = [
        chat_line(1000.0),
        b'{"timestamp": 1001, "request": {"messages": [',  # malformed JSON
        json.dumps({"timestamp": 1002, "request": {"model": "m"}}),  # missing messages
        json.dumps({"request": {"messages": [{"role": "user", "content": "x"}]}}),  # missing timestamp
        json.dumps({"timestamp": 1003, "request": {"messages": [{"role": "user", "content": 5}]}}),  # wrong type
        json.dumps({"timestamp": 1004, "request": {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}}),
        json.dumps({"timestamp": -3, "request": {"messages": [{"role": "user", "content": "x"}]}}),  # negative
        json.dumps({"timestamp": 1005, "request": {"messages": [{"role": "user", "content": "x"}]},
                    "usage": {"completion_tokens": 10**12}}),  # absurd token count
        b'{"timestamp": 1006, "request": {"messages": [{"role": "user", "content": "' + SECRET.encode() + b' \xff\xfe"}]}}',
        json.dumps({"timestamp": 1007, "request": {"messages": []}}),  # empty messages
        b"[1, 2, 3]",  # not an object
        chat_line(1100.0),
        chat_line(900.0),  # out of order beyond the window
        chat_line(1101.0, content="Mail me at " + SECRET),
    ]
    res = build_pool([write_lines(tmp_path / "bad.jsonl", lines)], "t", tmp_path / "pool", key=b"k", workers=1)
    s = res.summary
    assert s["rows_in"] == 14 and s["rows_accepted"] == 3 and s["rows_quarantined"] == 11
    assert s["rows_in"] == s["rows_accepted"] + s["rows_quarantined"]
    q = [json.loads(l) for l in res.quarantine_path.read_text().splitlines()]
    by_line = {r["line"]: r["reason"] for r in q}
    assert set(by_line) == set(range(2, 12)) | {13}
    assert "malformed JSON" in by_line[2] and "missing 'messages'" in by_line[3] and "missing timestamp" in by_line[4]
    assert "content must be" in by_line[5] and "'temperature' must be a number" in by_line[6]
    assert by_line[7] == "negative timestamp" and "absurd" in by_line[8] and "UTF-8" in by_line[9]
    assert "out of order" in by_line[13]
    assert all(set(r) == {"line", "reason", "bytes"} and r["bytes"] > 0 for r in q)
    # quarantine holds no content: the address on the non-UTF-8 line never reaches disk
    for f in (tmp_path / "pool").iterdir():
        assert SECRET.encode() not in f.read_bytes()
    assert len(read_pool(res.pool_path)) == 3


def test_bad_records_example_file(tmp_path):
    res = build_pool([ROOT / "examples/logs/bad_records.jsonl"], "demo", tmp_path / "p", workers=1)
    s = res.summary
    assert s["rows_quarantined"] >= 8 and s["rows_accepted"] >= 4
    assert s["rows_in"] == s["rows_accepted"] + s["rows_quarantined"]


def test_nothing_usable_raises_and_writes_nothing(tmp_path):
    import pytest

    from autoresearch_dagster.spec import SpecError

    p = write_lines(tmp_path / "allbad.jsonl", [b"{nope", json.dumps({"timestamp": -1, "messages": []}), b"\xff"])
    with pytest.raises(SpecError, match="nothing usable"):
        build_pool([p], "t", tmp_path / "pool", workers=1)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(SpecError, match="empty"):
        build_pool([tmp_path / "empty.jsonl"], "t", tmp_path / "pool", workers=1)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["allbad.jsonl", "empty.jsonl"]
