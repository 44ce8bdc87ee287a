"""Test helpers for the runner: an in-memory replay pool and a fault-injecting local streaming server.

The pool mirrors the POOL contract (``iter_requests``, ``PoolRequest`` fields and ``body()``) so the
runner's tests do not depend on the pool module. The server speaks the OpenAI streaming protocol on
127.0.0.1 and misbehaves as each request's first message asks (``FAULT:<kind>``).
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


# One SGLang /metrics text: two tensor-parallel ranks, a labelled counter, a histogram and an escaped label.
METRICS_TEXT = """\
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 7.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="0"} 3.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.9
sglang:token_usage{model_name="m",tp_rank="1"} 0.7
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m",cache_source="device"} 300.0
sglang:cached_tokens_total{model_name="m",cache_source="host"} 100.0
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 1.5
sglang:time_to_first_token_seconds_count{model_name="m"} 5.0
sglang:weird{a="x\\"y"} NaN 1700000000000
"""


@dataclass
class FakePoolRequest:
    id: str
    arrival_s: float
    api: str = "chat"
    messages: list[dict] | None = None
    prompt: str | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    response_format: dict | None = None
    sampling: dict = field(default_factory=dict)
    prompt_tokens: int = 10
    output_tokens: int = 4
    block_hashes: list[int] = field(default_factory=list)
    block_tokens: int = 64
    split: str = "serving"
    conversation_id: str | None = None
    turn: int | None = None

    def body(self) -> dict:
        b: dict[str, Any] = {"messages": self.messages} if self.api == "chat" else {"prompt": self.prompt}
        for k in ("tools", "tool_choice", "response_format"):
            if getattr(self, k) is not None:
                b[k] = getattr(self, k)
        b.update(self.sampling)
        return b


class FakePool:
    def __init__(self, rows: list[FakePoolRequest]):
        self.rows = rows
        self.meta: dict = {}

    def __len__(self) -> int:
        return len(self.rows)

    def request(self, i: int) -> FakePoolRequest:
        return self.rows[i]

    def iter_requests(self, split: str | None = "serving"):
        return (r for r in self.rows if split is None or r.split == split)


def make_pool(contents: list[str], *, output_tokens: int = 4, spacing_s: float = 1.0) -> FakePool:
    return FakePool([FakePoolRequest(id=f"r{i}", arrival_s=i * spacing_s,
                                     messages=[{"role": "user", "content": c}], output_tokens=output_tokens)
                     for i, c in enumerate(contents)])


def _chunk(text: str) -> bytes:
    obj = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(n: int) -> bytes:
    obj = {"id": "x", "object": "chat.completion.chunk", "choices": [],
           "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class FaultServer:
    """Streaming OpenAI-compatible server on loopback; behaviour per request from 'FAULT:<kind>'."""

    def __init__(self, *, token_gap_s: float = 0.002, slow_first_s: float = 3.0,
                 concurrency: int | None = None, service_s: float = 0.0,
                 metrics_text: str = '# HELP x\nsglang:num_running_reqs{model="m"} 3\nsglang:num_queue_reqs 1\n') -> None:
        self.token_gap_s = token_gap_s
        self.metrics_text = metrics_text
        self.slow_first_s = slow_first_s
        # A capacity limit: `concurrency` slots each held `service_s` before the first token,
        # so above concurrency/service_s req/s the queue (and TTFT) grows without bound.
        self.concurrency = concurrency
        self.service_s = service_s
        self._slots: asyncio.Semaphore | None = None
        self.arrivals: list[tuple[float, str]] = []
        self.flushes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ready = threading.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._chat(request)
        except (ConnectionResetError, asyncio.CancelledError):  # the client gave up: expected here
            return web.Response(status=499)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append((time.perf_counter(), request.headers.get("X-Request-Id", "")))
        body = await request.json()
        content = body["messages"][0]["content"]
        fault = content.split("FAULT:", 1)[1].split()[0] if "FAULT:" in content else "ok"
        n = int(body.get("max_tokens", 4))
        if fault == "500":
            return web.Response(status=500, text="boom")
        if fault == "429":
            return web.Response(status=429, text="slow down", headers={"Retry-After": "2"})
        if fault == "reset":
            request.transport.abort()
            await asyncio.sleep(0.01)
            return web.Response(status=200)
        if self.concurrency:
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.concurrency)
            async with self._slots:
                await asyncio.sleep(self.service_s)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault == "slowfirst":
            await asyncio.sleep(self.slow_first_s)
        await resp.write(b": keep-alive\n\n")
        for i in range(n):
            if fault == "hangmid" and i == 1:
                await asyncio.sleep(3600)
            if fault == "malformed" and i == 1:
                await resp.write(b"data: {not json at all\n\n")
            if fault == "truncjson" and i == n - 1:
                await resp.write(b'data: {"choices": [{"delta": {"cont')
                request.transport.abort()
                return resp
            if fault == "errormid" and i == 1:
                await resp.write(b'data: {"error": {"message": "engine overloaded", "code": 503}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
            await resp.write(_chunk("tok"))
            await asyncio.sleep(self.token_gap_s)
        await resp.write(_usage(n))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def flush(self, request: web.Request) -> web.Response:
        self.flushes += 1
        return web.Response(text="Cache flushed.")

    async def arrival_log(self, request: web.Request) -> web.Response:
        return web.json_response(self.arrivals)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text)

    def start(self) -> str:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault server did not start")
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/flush_cache", self.flush)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", self.health)
        app.router.add_get("/_arrivals", self.arrival_log)
        app.router.add_get("/v1/models", self.models)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:  # gather() of nothing asks for the thread's current loop, which this thread never set
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


class ServerProcess:
    """The fault server in its own process: timing tests must not share the client's GIL."""

    def __init__(self, **kwargs: Any) -> None:
        import subprocess
        import sys
        args = [sys.executable, "-m", "tests.loadgen.helpers", json.dumps(kwargs)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True,
                                     cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"fault server process did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def arrivals(self) -> list[tuple[float, str]]:
        import urllib.request
        with urllib.request.urlopen(self.url + "/_arrivals", timeout=10) as r:
            return [tuple(x) for x in json.loads(r.read())]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except Exception:
            self.proc.kill()


def _main() -> None:
    import sys
    srv = FaultServer(**json.loads(sys.argv[1]))
    srv.start()
    print(f"PORT {srv.port}", flush=True)
    srv._thread.join()


if __name__ == "__main__":
    _main()


def burst_pool(rate: float = 12.0, seed: int = 0) -> FakePool:
    """150 s of 2 req/s with a 30 s burst at ``rate`` req/s from 30 s (2000-token prompts, 300-token outputs):
    the demand curve the autoscaling tests replay."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arr = np.sort(np.concatenate([rng.uniform(a, b, int((b - a) * r)) for a, b, r in
                                  [(0, 30, 2), (30, 60, rate), (60, 150, 2)]]))
    arr[0] = 0.0
    return FakePool([FakePoolRequest(id=f"r{i}", arrival_s=float(a), messages=[{"role": "user", "content": "x"}],
                                     prompt_tokens=2000, output_tokens=300) for i, a in enumerate(arr)])
