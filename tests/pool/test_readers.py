import gzip
import json

import pytest

from autoresearch_dagster.logs import LogRecord, Rejected, detect_format, read_records
from autoresearch_dagster.spec import SpecError
from .conftest import ROOT, write_lines

TRACES = ROOT / "examples" / "traces"


def _ok(path, fmt="auto"):
    return [r for r in read_records(path, fmt) if isinstance(r, LogRecord)]


def test_autodetect_each_sample_format():
    assert detect_format(ROOT / "examples/logs/demo_chat.jsonl") == "openai"
    assert detect_format(TRACES / "mooncake_sample.jsonl") == "mooncake"
    assert detect_format(TRACES / "azure_sample.csv") == "azure"
    assert detect_format(TRACES / "burstgpt_sample.csv") == "burstgpt"


def test_trace_readers_parse_fields():
    mc = _ok(TRACES / "mooncake_sample.jsonl")
    assert len(mc) == 300 and all(r.hash_ids and r.input_length > 0 for r in mc)
    first = json.loads((TRACES / "mooncake_sample.jsonl").read_text().splitlines()[0])
    assert mc[0].timestamp_s == pytest.approx(first["timestamp"] / 1000)
    az = _ok(TRACES / "azure_sample.csv")
    assert len(az) == 300 and az[0].input_length == 1817 and az[0].output_length == 45
    assert az[1].timestamp_s - az[0].timestamp_s == pytest.approx(0.044517, abs=1e-5)
    bg = _ok(TRACES / "burstgpt_sample.csv")
    assert len(bg) == 300 and all(r.output_length > 0 for r in bg)


def test_openai_variants_nested_flattened_string_body_completions(tmp_path):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                   "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"}]
    lines = [
        json.dumps({"timestamp": "2026-03-02T09:00:00Z", "request": {"messages": msgs, "temperature": 0.2, "max_tokens": 50},
                    "response": {"usage": {"prompt_tokens": 10, "completion_tokens": 7,
                                           "prompt_tokens_details": {"cached_tokens": 4}}},
                    "timings": {"ttft_ms": 100, "latency_ms": 900}}),
        json.dumps({"ts": 1772442001000, "messages": msgs, "usage": {"completion_tokens": 3}, "latency_s": 1.5,
                    "session_id": "s1"}),  # flattened, epoch ms
        json.dumps({"created": 1772442002, "body": json.dumps({"messages": msgs, "top_p": 0.9})}),  # body as a string
        json.dumps({"timestamp": 1772442003.5, "request": {"prompt": "Once upon a time", "max_tokens": 9}}),
    ]
    recs = _ok(write_lines(tmp_path / "v.jsonl", lines))
    assert [r.api for r in recs] == ["chat", "chat", "chat", "completions"]
    a, b, c, d = recs
    assert a.timestamp_s == pytest.approx(1772442000.0) and a.usage_completion_tokens == 7 and a.cached_tokens == 4
    assert a.ttft_s == pytest.approx(0.1) and a.latency_s == pytest.approx(0.9) and a.sampling["temperature"] == 0.2
    assert b.timestamp_s == pytest.approx(1772442001.0) and b.usage_completion_tokens == 3 and b.conversation_id == "s1"
    assert b.latency_s == 1.5 and c.sampling == {"top_p": 0.9} and d.prompt == "Once upon a time"


def test_gzip_and_forced_format(tmp_path):
    src = (TRACES / "azure_sample.csv").read_bytes()
    gz = tmp_path / "a.csv.gz"
    gz.write_bytes(gzip.compress(src))
    assert len(_ok(gz)) == 300
    with pytest.raises(SpecError, match="not a mooncake|header lacks"):
        list(read_records(TRACES / "azure_sample.csv", "burstgpt"))


def test_empty_and_unknown_files_give_clear_errors(tmp_path):
    (tmp_path / "e.jsonl").write_bytes(b"\n \n")
    with pytest.raises(SpecError, match="empty"):
        detect_format(tmp_path / "e.jsonl")
    (tmp_path / "u.txt").write_text("hello world\n")
    with pytest.raises(SpecError, match="cannot detect"):
        detect_format(tmp_path / "u.txt")
    with pytest.raises(SpecError, match="does not exist"):
        detect_format(tmp_path / "missing.jsonl")


def test_reorder_window_sorts_small_disorder_and_quarantines_late(tmp_path):
    from .conftest import chat_line

    lines = [chat_line(100.0), chat_line(103.0), chat_line(101.0),  # small disorder: sorted
             chat_line(300.0),  # pushes the window forward: records before 240 s are released
             chat_line(102.0)]  # earlier than released records: quarantined
    out = list(read_records(write_lines(tmp_path / "o.jsonl", lines)))
    ok = [r.timestamp_s for r in out if isinstance(r, LogRecord)]
    bad = [r for r in out if isinstance(r, Rejected)]
    assert ok == [100.0, 101.0, 103.0, 300.0]
    assert len(bad) == 1 and bad[0].line == 5 and "out of order" in bad[0].reason


def test_line_batches_across_block_boundaries_oversized_and_crlf(tmp_path, monkeypatch):
    from autoresearch_dagster.logs import source

    monkeypatch.setattr(source, "MAX_LINE_BYTES", 40)
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"a": 1}\r\n\n  \n' + b"x" * 100 + b'\n{"b": 2}\n' + b"y" * 45 + b'\n{"c": 3}')
    for block in (3, 7, 64, 1 << 20):
        got = [(n, bytes(r), getattr(r, "size", None)) for b in source.iter_line_batches(p, 2, block) for n, r in b]
        assert got == [(1, b'{"a": 1}', None), (4, b"", 100), (5, b'{"b": 2}', None), (6, b"", 45),
                       (7, b'{"c": 3}', None)], block
