"""The emulator HTTP server against real clients (the openai SDK, aiohttp, curl) over a scripted core with known step times."""
from __future__ import annotations

import asyncio
import gzip
import json
import re
import shutil
import subprocess
import threading
import time

import aiohttp
import openai
import pytest
import requests

from autoresearch_dagster.tokens import count_tokens
from .helpers import ScriptedCore

pytestmark = pytest.mark.timeout(60)


def client(rs, warm=False):
    c = openai.OpenAI(base_url=rs.base_url + "/v1", api_key="none", max_retries=0, timeout=20)
    if warm:  # the SDK's first call pays for lazy imports and connection setup; keep it out of timings
        c.models.list()
    return c


def test_chat_streaming_with_usage_via_openai_sdk(scripted_server):
    rs, core = scripted_server(ScriptedCore(prefill_s=0.05, decode_s=0.01))
    msgs = [{"role": "system", "content": "Be brief. " * 150}, {"role": "user", "content": "Say something."}]
    c = client(rs, warm=True)
    t0 = time.perf_counter()
    stream = c.chat.completions.create(model="demo", messages=msgs, max_tokens=20, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True})
    times, text, usage, finish = [], "", None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter() - t0)
            text += chunk.choices[0].delta.content
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage:
            usage = chunk.usage
    assert len(times) == 20  # stream_interval 1: one chunk per decode step
    assert count_tokens(text) == usage.completion_tokens == 20
    assert finish == "length"
    assert usage.prompt_tokens == core.added[0][0].prompt_tokens > 100
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert 0.045 <= times[0] <= 0.2  # TTFT ~ one 50 ms prefill step
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert 0.007 <= sorted(gaps)[len(gaps) // 2] <= 0.02  # ITL ~ the 10 ms decode step
    # the same system prompt again: its leading blocks are cached
    again = client(rs).chat.completions.create(model="demo", messages=msgs[:1] + [{"role": "user", "content": "Other."}],
                                               max_tokens=3)
    assert again.usage.prompt_tokens_details.cached_tokens >= 64 * 5


def test_non_streaming_chat_and_completions(scripted_server):
    rs, _ = scripted_server(ScriptedCore(prefill_s=0.005, decode_s=0.001))
    c = client(rs)
    r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
                                  extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert count_tokens(r.choices[0].message.content) == r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    comp = c.completions.create(model="demo", prompt="Once upon a time", max_tokens=9, logprobs=2)
    assert comp.object == "text_completion"
    assert comp.usage.completion_tokens <= 9 and count_tokens(comp.choices[0].text) == comp.usage.completion_tokens
    assert len(comp.choices[0].logprobs.tokens) == comp.usage.completion_tokens
    # completions streaming with usage
    s = c.completions.create(model="demo", prompt="abc " * 10, max_tokens=6, stream=True,
                             stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    texts, usage = [], None
    for ch in s:
        if ch.choices and ch.choices[0].text:
            texts.append(ch.choices[0].text)
        usage = ch.usage or usage
    assert len(texts) == 6 and usage.completion_tokens == 6 and count_tokens("".join(texts)) == 6
    # without ignore_eos the length is a seeded draw capped by max_tokens, and deterministic
    a = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "tell me"}], max_tokens=500)
    b = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "tell me"}], max_tokens=500)
    assert a.usage.completion_tokens == b.usage.completion_tokens <= 500
    assert a.choices[0].message.content == b.choices[0].message.content


def test_bad_requests_are_clear_400s(scripted_server):
    rs, core = scripted_server()
    c = client(rs)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model="demo", messages=[])
    r = requests.post(rs.base_url + "/v1/chat/completions", data=b"{not json", timeout=5)
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
    r = requests.post(rs.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 10 ** 9}, timeout=5)
    assert r.status_code == 400 and r.json()["param"] == "max_tokens" and "context length" in r.json()["message"]
    assert core.added == []  # nothing invalid reached the engine


def test_stream_interval_groups_tokens_per_chunk(demo_endpoint):
    from autoresearch_dagster.emulator.server import EmulatorServer, serve_in_thread

    core = ScriptedCore(decode_s=0.005)
    core.resolved_config = lambda: {"stream_interval": 4, "tp_size": 1}
    with serve_in_thread(EmulatorServer(demo_endpoint, {"stream_interval": 4}, core=core)) as rs:
        s = client(rs).chat.completions.create(model="d", messages=[{"role": "user", "content": "x"}], max_tokens=10,
                                               stream=True, extra_body={"ignore_eos": True})
        sizes = [count_tokens(ch.choices[0].delta.content) for ch in s if ch.choices and ch.choices[0].delta.content]
    assert sizes == [1, 3, 4, 2]  # first token at once, then at each multiple of stream_interval, and at the end


def test_admin_surface(scripted_server, tmp_path):
    rs, core = scripted_server()
    base = rs.base_url
    assert requests.get(base + "/health", timeout=5).status_code == 200
    models = requests.get(base + "/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "gemma-moe-26b-a4b"
    info = requests.get(base + "/server_info", timeout=5).json()
    assert info["version"].startswith("emulator-") and info["max_total_num_tokens"] == 100000
    assert info["chunked_prefill_size"] == 8192 and info["internal_states"][0]["effective_max_running_requests_per_dp"] == 256
    # idle: flush succeeds (GET and POST)
    assert requests.post(base + "/flush_cache", timeout=5).status_code == 200
    assert requests.get(base + "/flush_cache", timeout=5).text.startswith("Cache flushed")
    assert core.flushes == 2
    # busy: refused at once, or after waiting for idle with a timeout
    done = threading.Event()

    def long_request():
        client(rs).chat.completions.create(model="d", messages=[{"role": "user", "content": "x"}], max_tokens=100,
                                           extra_body={"ignore_eos": True})
        done.set()

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.time() + 10
    while not rs.server.driver.in_flight and time.time() < deadline:
        time.sleep(0.005)
    busy = requests.post(base + "/flush_cache", timeout=5)
    assert busy.status_code == 400 and "running or waiting" in busy.text and core.flushes == 2
    assert requests.post(base + "/flush_cache?timeout=0.05", timeout=5).status_code == 400
    t_wait = time.perf_counter()
    waited = requests.post(base + "/flush_cache?timeout=10", timeout=15)
    assert waited.status_code == 200 and core.flushes == 3
    assert time.perf_counter() - t_wait >= 0.05  # it waited for the 100-token request to finish
    t.join(5)
    assert done.is_set()


def test_flush_without_radix_cache_is_400(scripted_server):
    rs, core = scripted_server(ScriptedCore(radix=False))
    r = requests.post(rs.base_url + "/flush_cache", timeout=5)
    assert r.status_code == 400 and "no prefix cache" in r.text


_SAMPLE = re.compile(r'^(sglang:[a-zA-Z0-9_]+)(\{[^}]*\})? (\S+)$')


def parse_metrics(text: str) -> tuple[dict[str, str], dict[str, float]]:
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, f"not a Prometheus sample line: {line!r}"
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return types, samples


def test_metrics_exposition_has_sglang_names_labels_and_histograms(scripted_server):
    rs, _ = scripted_server(ScriptedCore(prefill_s=0.03, decode_s=0.01))
    c = client(rs, warm=True)
    for i in range(3):
        c.chat.completions.create(model="d", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=5,
                                  extra_body={"ignore_eos": True})
    types, samples = parse_metrics(requests.get(rs.base_url + "/metrics", timeout=5).text)
    assert types["sglang:time_to_first_token_seconds"] == "histogram"
    assert types["sglang:inter_token_latency_seconds"] == "histogram"
    assert types["sglang:e2e_request_latency_seconds"] == "histogram"
    assert types["sglang:num_running_reqs"] == "gauge" and types["sglang:prompt_tokens_total"] == "counter"
    lab = 'model_name="gemma-moe-26b-a4b",engine_type="unified"'
    assert samples[f"sglang:num_requests_total{{{lab}}}"] == 3
    assert samples[f"sglang:generation_tokens_total{{{lab}}}"] == 15
    assert samples[f"sglang:time_to_first_token_seconds_count{{{lab}}}"] == 3
    ttft_mean = samples[f"sglang:time_to_first_token_seconds_sum{{{lab}}}"] / 3
    assert 0.025 <= ttft_mean <= 0.1
    assert samples[f"sglang:inter_token_latency_seconds_count{{{lab}}}"] == 12  # once per token after the first
    assert samples[f'sglang:time_to_first_token_seconds_bucket{{{lab},le="0.1"}}'] == 3
    assert samples[f'sglang:num_running_reqs{{{lab},tp_rank="0",pp_rank="0",moe_ep_rank="0"}}'] == 0


def test_profile_files_are_chrome_traces(scripted_server, tmp_path):
    rs, core = scripted_server()
    base = rs.base_url
    r = requests.post(base + "/start_profile", json={"output_dir": str(tmp_path), "profile_id": "p1"}, timeout=5)
    assert r.status_code == 200
    assert requests.post(base + "/start_profile", json={}, timeout=5).status_code == 400  # second start
    client(rs).chat.completions.create(model="d", messages=[{"role": "user", "content": "x"}], max_tokens=4)
    assert requests.post(base + "/stop_profile", timeout=5).status_code == 200
    path = tmp_path / "p1-TP-0.trace.json.gz"
    trace = json.loads(gzip.decompress(path.read_bytes()))
    assert trace["traceEvents"] and trace["traceEvents"][0]["ph"] == "X"
    assert requests.post(base + "/stop_profile", timeout=5).status_code == 400  # not running
    # num_steps stops by itself
    requests.post(base + "/start_profile", json={"output_dir": str(tmp_path), "profile_id": "p2", "num_steps": 3},
                  timeout=5)
    client(rs).chat.completions.create(model="d", messages=[{"role": "user", "content": "x"}], max_tokens=10,
                                       extra_body={"ignore_eos": True})
    auto = json.loads(gzip.decompress((tmp_path / "p2-TP-0.trace.json.gz").read_bytes()))
    assert len(auto["traceEvents"]) == 3
    bad = requests.post(base + "/start_profile", json={"activities": ["MEM"]}, timeout=5)
    assert bad.status_code == 400 and "not emulated" in bad.text


def test_client_disconnect_aborts_in_the_core(scripted_server):
    rs, core = scripted_server(ScriptedCore(decode_s=0.01))

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(rs.base_url + "/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 500,
                                    "stream": True, "ignore_eos": True}) as resp:
                n = 0
                async for _ in resp.content.iter_any():
                    n += 1
                    if n >= 3:
                        break  # leaving the block closes the connection mid-stream
    async def go_full():  # non-streaming: the client gives up while the answer is being generated
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as s:
            with pytest.raises(asyncio.TimeoutError):
                await s.post(rs.base_url + "/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "y"}], "max_tokens": 500,
                                   "ignore_eos": True})

    asyncio.run(go())
    asyncio.run(go_full())
    deadline = time.time() + 5
    while len(core.aborted) < 2 and time.time() < deadline:
        time.sleep(0.02)
    assert len(core.aborted) == 2 and not core.running
    assert rs.server.counters["sglang:num_aborted_requests_total"] == 2


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_no_buffer_streams(scripted_server):
    rs, _ = scripted_server(ScriptedCore(decode_s=0.01))
    body = json.dumps({"model": "d", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    out = subprocess.run(["curl", "-sS", "--no-buffer", "-H", "Content-Type: application/json", "-d", body,
                          rs.base_url + "/v1/chat/completions"], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    events = [line[6:] for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 8


def test_streamed_logprobs_and_continuous_usage(scripted_server):
    rs, _ = scripted_server(ScriptedCore(prefill_s=0.005, decode_s=0.002))
    s = client(rs).chat.completions.create(
        model="d", messages=[{"role": "user", "content": "x"}], max_tokens=6, stream=True, logprobs=True,
        top_logprobs=2, stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True})
    content = [ch for ch in s if ch.choices and ch.choices[0].delta.content]
    assert [ch.usage.completion_tokens for ch in content] == [1, 2, 3, 4, 5, 6]
    for ch in content:
        (tok,) = ch.choices[0].logprobs.content
        assert tok.token == ch.choices[0].delta.content and tok.logprob <= 0 and len(tok.top_logprobs) == 2
