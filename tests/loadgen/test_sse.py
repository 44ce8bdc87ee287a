"""SSE parsing: events split at every byte boundary, comments, [DONE], usage in the last chunk, errors."""
import json

from autoresearch_dagster.loadgen.sse import SSEDecoder, StreamTracker


def _chunk(text):
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


STREAM = (b": keep-alive\r\n\r\n"
          + b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}).encode() + b"\r\n\r\n"
          + b"data: " + json.dumps(_chunk("Hel")).encode() + b"\n\n"
          + b": ping\n\n"
          + b"data:" + json.dumps(_chunk("lo")).encode() + b"\r\r"
          + b"event: message\nid: 7\ndata: " + json.dumps(_chunk("!")).encode() + b"\n\n"
          + b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 64}}}).encode() + b"\n\n"
          + b"data: [DONE]\n\n")


def _events(parts):
    dec = SSEDecoder()
    out = []
    for p in parts:
        out.extend(dec.feed(p))
    out.extend(dec.finish())
    return out


def test_every_split_point_gives_the_same_events():
    whole = _events([STREAM])
    assert len(whole) == 6 and whole[-1] == b"[DONE]"
    for i in range(len(STREAM) + 1):
        assert _events([STREAM[:i], STREAM[i:]]) == whole, f"split at byte {i}"


def test_byte_by_byte_feed():
    assert _events([STREAM[i:i + 1] for i in range(len(STREAM))]) == _events([STREAM])


def test_tracker_counts_content_usage_and_done():
    tr = StreamTracker()
    for k, ev in enumerate(_events([STREAM])):
        tr.on_event(ev, 0.1 * k)
    assert tr.n_content == 3  # role-only chunk is not content
    assert tr.first_content_t == 0.1 and tr.done
    assert tr.usage_tokens == 3 and tr.cached_tokens == 64
    assert len(tr.gaps) == 2 and abs(tr.gaps[0] - 0.1) < 1e-9
    assert tr.error is None and tr.n_malformed == 0


def test_error_object_mid_stream_and_malformed_lines():
    tr = StreamTracker()
    tr.on_event(json.dumps(_chunk("a")).encode(), 0.0)
    tr.on_event(b"{oops", 0.1)
    tr.on_event(b"[1, 2]", 0.15)
    tr.on_event(json.dumps({"error": {"message": "overloaded", "code": 503}}).encode(), 0.2)
    assert tr.n_malformed == 2
    assert tr.error == "overloaded"
    tr2 = StreamTracker()
    tr2.on_event(json.dumps({"object": "error", "message": "bad"}).encode(), 0.0)
    assert tr2.error == "bad"


def test_completions_text_and_tool_calls_count_as_content():
    tr = StreamTracker()
    tr.on_event(json.dumps({"choices": [{"text": "x"}]}).encode(), 0.0)
    tr.on_event(json.dumps({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}).encode(), 0.01)
    tr.on_event(json.dumps({"choices": [{"delta": {"content": ""}, "finish_reason": "stop"}]}).encode(), 0.02)
    assert tr.n_content == 2


def test_single_newline_separated_events_and_unterminated_last_event():
    dec = SSEDecoder()
    evs = dec.feed(b'data: {"a":1}\ndata: {"b":2}\ndata: [DONE]')
    evs += dec.finish()
    assert evs == [b'{"a":1}', b'{"b":2}', b"[DONE]"]


def test_fast_path_agrees_with_json_decoding():
    cases = [b'{"choices":[{"index":0,"delta":{"content":"hi"}}]}',
             b'{"choices": [{"index": 0, "delta": {"content": "hi"}}]}',
             b'{"choices":[{"index":0,"delta":{"content":""}}]}',
             b'{"choices":[{"index":0,"delta":{"content":null}}]}',
             b'{"choices":[{"index":0,"delta":{"reasoning_content":"r"}}]}',
             b'{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":7}}',
             b'{"choices":[{"delta":{"content":"a"',  # truncated: not the fast path
             b'{"error":{"message":"content":"x"}}']
    for data in cases:
        fast = StreamTracker()
        fast.on_event(data, 1.0)
        try:
            obj = json.loads(data)
            expected = 1 if any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("reasoning_content")
                                for c in obj.get("choices", [])) else 0
        except ValueError:
            expected = 0
            assert fast.n_malformed == 1, data
        assert fast.n_content == expected, data
