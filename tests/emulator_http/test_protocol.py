"""The OpenAI wire format of the emulator server: validation errors, lengths, text, chunks, log-probabilities."""
from __future__ import annotations

import json

import pytest

from autoresearch_dagster.emulator.openai_protocol import (
    RequestError, ResponseWriter, TextPieces, output_length, parse_request, text_seed,
)
from autoresearch_dagster.tokens import block_hashes, count_tokens, render_prompt

CTX = 4096


def chat(**kw):
    return {"model": "m", "messages": [{"role": "user", "content": "hello there, how are you today?"}], **kw}


@pytest.mark.parametrize("body,param,needle", [
    (chat(n=2), "n", "n must be 1"),
    ({"model": "m"}, "messages", "messages"),
    (chat(messages=[{"role": "robot", "content": "x"}]), "messages", "role"),
    (chat(stream_options={"include_usage": True}), "stream_options", "stream"),
    (chat(max_tokens=0), "max_tokens", ">= 1"),
    (chat(max_completion_tokens="ten"), "max_completion_tokens", "integer"),
    (chat(max_tokens=CTX), "max_tokens", "context length"),
    (chat(top_logprobs=3), "top_logprobs", "logprobs"),
    (chat(logprobs=True, top_logprobs=50), "top_logprobs", "between 0 and 20"),
    (chat(temperature="hot"), "temperature", "number"),
    (chat(stop=5), "stop", "string"),
    (chat(ignore_eos="yes"), "ignore_eos", "true or false"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_chat_rejections_name_the_field(body, param, needle):
    with pytest.raises(RequestError) as e:
        parse_request("chat", body, context_len=CTX)
    assert e.value.param == param and e.value.status == 400
    assert needle in e.value.message


def test_completion_rejections():
    with pytest.raises(RequestError, match="batched prompts"):
        parse_request("completions", {"prompt": ["a", "b"]}, context_len=CTX)
    with pytest.raises(RequestError, match="logprobs"):
        parse_request("completions", {"prompt": "a", "logprobs": True}, context_len=CTX)
    with pytest.raises(RequestError, match="JSON object"):
        parse_request("completions", ["a"], context_len=CTX)
    with pytest.raises(RequestError, match="context length"):
        parse_request("completions", {"prompt": list(range(CTX))}, context_len=CTX)


def test_prompt_tokens_and_prefix_blocks_match_the_pool_view():
    msgs = [{"role": "system", "content": "You are a terse assistant. " * 40},
            {"role": "user", "content": "Summarize the plot of a long novel in two lines."}]
    req = parse_request("chat", {"messages": msgs, "max_tokens": 32}, context_len=CTX)
    text = render_prompt(msgs, None)
    assert req.prompt_tokens == count_tokens(text)
    assert req.block_hashes(16) == block_hashes(text, 16)
    # a second conversation sharing the system prompt shares the leading blocks, not the last ones
    other = parse_request("chat", {"messages": [msgs[0], {"role": "user", "content": "Something else entirely."}]},
                          context_len=CTX)
    a, b = req.block_hashes(16), other.block_hashes(16)
    shared = sum(1 for x, y in zip(a, b) if x == y)
    assert shared >= 10 and a[-1] != b[-1]
    ids = parse_request("completions", {"prompt": [5, 300, 70000, 26 ** 6 + 3]}, context_len=CTX)
    assert ids.prompt_tokens == 4 == count_tokens(ids.prompt_text)


def test_output_length_pinned_by_ignore_eos_else_seeded_and_capped():
    pinned = parse_request("chat", chat(max_tokens=77, ignore_eos=True), context_len=CTX)
    assert output_length(pinned, 0) == 77
    lengths = []
    for i in range(200):
        r = parse_request("chat", chat(messages=[{"role": "user", "content": f"question number {i}"}], max_tokens=400),
                          context_len=CTX)
        n = output_length(r, 0)
        assert n == output_length(r, 0)  # deterministic
        lengths.append(n)
    assert max(lengths) <= 400 and min(lengths) >= 1
    assert 100 <= sorted(lengths)[100] <= 300  # median near the documented 200
    assert sum(n == 400 for n in lengths) < 60  # the cap binds for the tail only
    completions_default = parse_request("completions", {"prompt": "hi"}, context_len=CTX)
    assert completions_default.max_tokens == 16


def test_generated_text_has_exactly_completion_tokens():
    pieces = TextPieces(1234, 10)
    for n in (1, 7, 10, 55, 300):
        assert count_tokens(pieces.text(0, n)) == n
    assert pieces.text(0, 30) == pieces.text(0, 13) + pieces.text(13, 30)


def _events(sse: str) -> list:
    out = []
    for block in sse.strip().split("\n\n"):
        assert block.startswith("data: ")
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_chat_chunks_are_openai_shaped_with_logprobs():
    req = parse_request("chat", chat(stream=True, logprobs=True, top_logprobs=3, max_tokens=5, ignore_eos=True),
                        context_len=CTX)
    seed = text_seed(req, 0)
    w = ResponseWriter(req, rid="abc", model="m", text_seed=seed, pieces=TextPieces(seed, 5))
    evs = _events(w.chunk(0, 2, first=True) + w.chunk(2, 5, first=False, finish_reason="length")
                  + w.usage_chunk({"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}) + "data: [DONE]\n\n")
    assert [e["object"] for e in evs[:-1]] == ["chat.completion.chunk"] * 4
    assert evs[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in evs[:3])
    assert count_tokens(content) == 5
    lp = evs[0]["choices"][0]["logprobs"]["content"]
    assert len(lp) == 2 and len(lp[0]["top_logprobs"]) == 3 and lp[0]["logprob"] <= 0
    assert lp[0]["top_logprobs"][0]["token"] == lp[0]["token"]
    assert [t["logprob"] for t in lp[0]["top_logprobs"]] == sorted((t["logprob"] for t in lp[0]["top_logprobs"]),
                                                                   reverse=True)
    assert evs[2]["choices"][0]["finish_reason"] == "length" and evs[2]["choices"][0]["delta"] == {}
    assert evs[3]["choices"] == [] and evs[3]["usage"]["completion_tokens"] == 5
    assert evs[4] == "[DONE]"
    full = w.full(5, 0)
    assert full["choices"][0]["message"]["content"] == content
    assert full["choices"][0]["logprobs"]["content"] == lp + evs[1]["choices"][0]["logprobs"]["content"]


def test_completion_logprobs_format():
    req = parse_request("completions", {"prompt": "abc", "logprobs": 2, "max_tokens": 4, "echo": True},
                        context_len=CTX)
    seed = text_seed(req, 0)
    w = ResponseWriter(req, rid="x", model="m", text_seed=seed, pieces=TextPieces(seed, 4))
    body = w.full(4, 0)
    ch = body["choices"][0]
    assert ch["text"].startswith("abc") and count_tokens(ch["text"][3:]) == 4
    lp = ch["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert lp["text_offset"][0] == 3 and all(len(t) == 2 for t in lp["top_logprobs"])
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
