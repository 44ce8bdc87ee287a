"""Failure classes read from error bodies: vLLM's refusals (context too long, tools without a parser)
through the runner against a local stand-in that answers with vLLM 0.32's own error bodies."""
from __future__ import annotations

import json

from aiohttp import web

from autoresearch_dagster.loadgen.failures import (
    CONTEXT_TOO_LONG, UNSUPPORTED_FEATURE, classify_http_error, error_message, tally,
)
from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
from autoresearch_dagster.loadgen.records import ScheduledRequest
from tests.loadgen.helpers import FaultServer

# Bodies as vLLM 0.32's OpenAI server sent them (captured from the tiny Llama on this machine).
VLLM_TOOLS = (b'{"error":{"message":"\\"auto\\" tool choice requires --enable-auto-tool-choice and '
              b'--tool-call-parser to be set","type":"BadRequestError","param":null,"code":400}}')
VLLM_CONTEXT = (b'{"error":{"message":"This model\'s maximum context length is 16384 tokens. However, your prompt '
                b'contains at least 16385 input tokens, which exceeds this limit even without any output tokens.",'
                b'"type":"BadRequestError","param":"input_tokens","code":400}}')


def test_classify_vllm_bodies():
    assert classify_http_error(400, VLLM_CONTEXT)[0] == CONTEXT_TOO_LONG
    cls, msg = classify_http_error(400, VLLM_TOOLS)
    assert cls == UNSUPPORTED_FEATURE and msg.startswith('"auto" tool choice requires --enable-auto-tool-choice')
    assert classify_http_error(400, b'{"error":{"message":"temperature must be >= 0"}}') == (
        "http_4xx", "temperature must be >= 0")
    assert classify_http_error(500, VLLM_CONTEXT)[0] == "http_5xx"  # a server error stays one, whatever it says
    assert classify_http_error(429, b"slow down") == ("http_429", "slow down")


def test_error_message_shapes():
    assert error_message(b'{"detail":"Not Found"}') == "Not Found"
    assert error_message(b'{"object":"error","message":"bad","code":400}') == "bad"
    assert error_message(b"plain text\n") == "plain text"
    assert len(error_message(b"x" * 5000)) == 300


class VllmStandIn(FaultServer):
    """Refuses as vLLM does: tools with tool_choice auto (no tool parser), prompts over the context."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if body.get("tools"):
            return web.Response(status=400, body=VLLM_TOOLS, content_type="application/json")
        if "LONG" in body["messages"][0]["content"]:
            return web.Response(status=400, body=VLLM_CONTEXT, content_type="application/json")
        return await super()._chat(request)


def _req(i: int, content: str, **extra) -> ScheduledRequest:
    return ScheduledRequest(request_id=f"r{i}", send_offset_s=0.02 * i, api="chat",
                            body={"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 3,
                                  "stream": True, **extra}, prompt_tokens=5, output_tokens=3)


def test_runner_records_each_refusal_class_with_its_message():
    server = VllmStandIn()
    url = server.start()
    try:
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        schedule = [_req(0, "hello"), _req(1, "LONG prompt"), _req(2, "hi", tools=tools, tool_choice="auto"),
                    _req(3, "hello again"), _req(4, "LONG again")]
        out = HttpDeployment(url, settings=RunnerSettings(scrape_metrics_s=None, max_send_lag_p99_s=1.0)).run_step(
            schedule, step_id="s", timeout_s=10)
    finally:
        server.stop()
    by_id = {r.request_id: r for r in out.records}
    assert [by_id[f"r{i}"].status for i in range(5)] == ["ok", "error", "error", "ok", "error"]
    assert by_id["r1"].error_class == by_id["r4"].error_class == CONTEXT_TOO_LONG
    assert by_id["r2"].error_class == UNSUPPORTED_FEATURE and by_id["r2"].http_status == 400
    failures = out.meta["failures"]
    assert failures[CONTEXT_TOO_LONG]["count"] == 2
    assert "maximum context length is 16384" in failures[CONTEXT_TOO_LONG]["message"]
    assert failures[UNSUPPORTED_FEATURE] == {"count": 1, "message": error_message(VLLM_TOOLS)}
    assert tally(out.records) == {CONTEXT_TOO_LONG: {"count": 2, "message": None},
                                  UNSUPPORTED_FEATURE: {"count": 1, "message": None}}
