"""A stand-in for vLLM's OpenAI server (tests only): /health, /version, /server_info, /v1/models and
streaming chat completions, whatever vLLM flags it is given (it always reports max_num_seqs 8
as resolved), refusing tools as vLLM does without a tool parser; after ``--crash-after`` completions it logs the worker error vLLM's CPU
backend was seen to die with and exits, as the real server does when its engine core dies."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from aiohttp import web

CRASH = "RuntimeError: CPU Generator does not use offset"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--crash-after", type=int, default=10**9)
    args, _ = ap.parse_known_args()  # the harness's vLLM flags are accepted and ignored
    served = {"n": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("tools"):
            return web.json_response({"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice '
                                                           'and --tool-call-parser to be set', "code": 400}},
                                     status=400)
        if served["n"] >= args.crash_after:
            print("(EngineCore pid=1) ERROR Traceback (most recent call last):", file=sys.stderr)
            print('  File "vllm/v1/worker/cpu_model_runner.py", line 1, in sample', file=sys.stderr)
            print(f"(EngineCore pid=1) {CRASH}", file=sys.stderr, flush=True)
            os._exit(1)
        served["n"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(int(body.get("max_tokens", 3))):
            await resp.write(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
            await asyncio.sleep(0.002)
        await resp.write(b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % int(body.get("max_tokens", 3)))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0-standin"})

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"vllm_config": {"scheduler_config": {"max_num_seqs": 8}}})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", ok)
    app.router.add_get("/version", version)
    app.router.add_get("/server_info", info)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
