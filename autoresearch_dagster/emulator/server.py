"""Owns the emulator's real-time HTTP server: the OpenAI-compatible API and SGLang's admin surface over an EngineCore.

``EmulatorServer`` builds the aiohttp application; ``serve_in_thread`` runs it on a background
thread (tests, ``EmulatorEngine(mode="http")``) and ``serve`` runs it in the foreground until
SIGINT/SIGTERM (the CLI). Generation requests enter the core through ``RealtimeDriver``; their
tokens come back when the emulated step that produced them ends on the wall clock, and are
written as one SSE write per step per request (``stream_interval`` tokens per chunk, as SGLang).

Served: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming or not, usage with
``prompt_tokens_details.cached_tokens``, log-probabilities in OpenAI's format), ``GET /v1/models``,
``GET /health`` (+ ``/health_generate``, ``/ready``), ``GET /server_info`` (+ ``/get_server_info``),
``GET /model_info``, ``GET|POST /flush_cache``, ``GET /metrics``, ``POST /start_profile``,
``POST /stop_profile``. See docs/emulator_http.md.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from autoresearch_dagster.emulator.catalog import gpu, model_card
from autoresearch_dagster.emulator.calibrations import calibrated_efficiency
from autoresearch_dagster.emulator.cost import endpoint_efficiency
from autoresearch_dagster.emulator.core import EngineCore, endpoint_version
from autoresearch_dagster.emulator.openai_protocol import (
    GenRequest, RequestError, ResponseWriter, TextPieces, error_body, output_length, parse_request, text_seed, usage,
)
from autoresearch_dagster.emulator.profile import write_profile
from autoresearch_dagster.emulator.prometheus import (
    E2E_BUCKETS, ITL_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, Histogram, exposition, render_scalar,
)
from autoresearch_dagster.emulator.realtime import RealtimeDriver, TokenStream
from autoresearch_dagster.spec import EndpointSpec, validate_server_config

try:
    import uvloop
except ImportError:  # pragma: no cover - non-Linux
    uvloop = None

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: output reserve SGLang admits against
DEFAULT_BLOCK_TOKENS = 64  # prefix-block size of the hashes handed to the core (the pool's default)
_PROFILE_ACTIVITIES = {"CPU", "GPU"}
_FLUSH_OK = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
             "requests, the operation will not be performed.)\n")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(obj), status=status, content_type="application/json")


def _error(message: str, status: int = 400, param: str | None = None) -> web.Response:
    return _json(error_body(message, status=status, param=param), status=status)


@dataclass
class _Profile:
    output_dir: Path
    profile_id: str
    prefix: str | None
    num_steps: int | None
    start_step: int
    steps_seen: int = 0
    active: bool = False


class EmulatorServer:
    """aiohttp app over an ``EngineCore`` driven in real time.

    ``config`` is the server config to emulate (SGLang knob names); ``None`` takes the endpoint's.
    ``core`` injects a ready-made engine core (a calibrated one, or a test double); by default the
    core is built from the endpoint's model card and hardware.
    """

    def __init__(self, endpoint: EndpointSpec, config: dict | None = None, *, seed: int = 0, noise: Any = None,
                 model_name: str | None = None, block_tokens: int = DEFAULT_BLOCK_TOKENS, core: Any = None,
                 request_log_size: int = 100_000):
        self.endpoint = endpoint
        self.config = validate_server_config(endpoint.server_config if config is None else config)
        self.seed = seed
        self.model_name = model_name or endpoint.model
        self.block_tokens = block_tokens
        card = model_card(endpoint.model)
        self.core = core if core is not None else EngineCore(card, gpu(endpoint.hardware.gpu), endpoint.gpus,
                                                             self.config, seed=seed, noise=noise,
                                                             efficiency=calibrated_efficiency(endpoint)
                                                             or endpoint_efficiency(endpoint.engine_options))
        resolved = self.core.resolved_config()
        self.max_total_num_tokens = int(self._core_info()["max_total_num_tokens"])
        self.context_len = card.context_len
        self.stream_interval = max(1, int(resolved.get("stream_interval") or 1))
        self.tp_size = max(1, int(resolved.get("tp_size") or 1))
        self.driver: RealtimeDriver | None = None
        self.state = "starting"
        self.started_at = time.time()
        self._profile: _Profile | None = None
        self._labels = {"model_name": self.model_name, "engine_type": "unified"}
        self._sched_labels = {**self._labels, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        self.h_ttft = Histogram("sglang:time_to_first_token_seconds", TTFT_BUCKETS)
        self.h_itl = Histogram("sglang:inter_token_latency_seconds", ITL_BUCKETS)
        self.h_tpot = Histogram("sglang:request_time_per_output_token_seconds", TPOT_BUCKETS)
        self.h_e2e = Histogram("sglang:e2e_request_latency_seconds", E2E_BUCKETS)
        self.counters = {name: 0.0 for name in (
            "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:cached_tokens_total",
            "sglang:num_requests_total", "sglang:num_aborted_requests_total", "sglang:http_requests_total")}
        self.http_active = 0
        # engine-clock timings of recently finished requests, for comparing with the virtual-time mode
        self.request_log: deque[ServedRequest] = deque(maxlen=request_log_size)
        self.app = self._build_app()

    # ------------------------------------------------------------------ app
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_get("/v1/models", self._models)
        for path in ("/health", "/health_generate", "/ready"):
            r.add_get(path, self._health)
        r.add_get("/server_info", self._server_info)
        r.add_get("/get_server_info", self._server_info)
        r.add_get("/model_info", self._model_info)
        r.add_route("GET", "/flush_cache", self._flush_cache)
        r.add_route("POST", "/flush_cache", self._flush_cache)
        r.add_get("/metrics", self._metrics)
        r.add_post("/start_profile", self._start_profile)
        r.add_post("/stop_profile", self._stop_profile)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.driver = RealtimeDriver(self.core, on_step=self._on_step)
        await self.driver.start()
        self.state = "ready"

    async def _on_shutdown(self, _app: web.Application) -> None:
        self.state = "stopping"
        if self.driver is not None:
            await self.driver.stop()

    @property
    def healthy(self) -> bool:
        return self.state == "ready" and self.driver is not None and self.driver.running

    # ------------------------------------------------------------------ generation
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _generate(self, request: web.Request, api: str) -> web.StreamResponse:
        self.counters["sglang:http_requests_total"] += 1
        self.http_active += 1
        received = self.driver.now() if self.driver is not None else None
        try:
            try:
                raw = await request.read()
                body = json.loads(raw) if raw else None
            except ValueError as e:
                return _error(f"the request body is not valid JSON: {e}")
            try:
                req = parse_request(api, body, context_len=self.context_len)  # type: ignore[arg-type]
            except RequestError as e:
                return _error(e.message, e.status, e.param)
            if not self.healthy:
                return _error("the emulator engine is not ready", 503)
            rid = req.rid or request.headers.get("X-Request-Id") or uuid.uuid4().hex
            if self.driver.has(rid):
                return _error(f"request id {rid!r} is already in flight", 400, "rid")
            tseed = text_seed(req, self.seed)
            n_out = output_length(req, self.seed)
            if req.prompt_tokens + min(n_out, CLIP_MAX_NEW_TOKENS) >= self.max_total_num_tokens:
                # SGLang rejects what can never fit its KV pool rather than queueing it forever
                return _error(f"the request needs {req.prompt_tokens} prompt + {min(n_out, CLIP_MAX_NEW_TOKENS)} "
                              f"reserved output tokens, more than the KV cache holds ({self.max_total_num_tokens} "
                              "tokens)", 400, "messages" if api == "chat" else "prompt")
            writer = ResponseWriter(req, rid=rid, model=self.model_name, text_seed=tseed,
                                    pieces=TextPieces(tseed, n_out))
            stream = self.driver.submit(rid, req.prompt_tokens, n_out, req.block_hashes(self.block_tokens),
                                        self.block_tokens, received_s=received)
            acct = _Accounting(stream.arrival_s)
            try:
                if req.stream:
                    return await self._stream(request, req, stream, writer, acct)
                return await self._full(req, stream, writer, acct)
            finally:
                if not acct.finished:
                    self.driver.abort(rid)
                    self.counters["sglang:num_aborted_requests_total"] += 1
        finally:
            self.http_active -= 1

    def _account(self, acct: "_Accounting", t: float, n: int, cached: int | None) -> None:
        """Per delivered event: SGLang's per-request latency metrics (engine clock)."""
        if cached is not None:
            acct.cached = cached
        if n <= 0:
            return
        if acct.first_t is None:
            acct.first_t = t
            self.h_ttft.observe(t - acct.arrival)
        else:
            self.h_itl.observe((t - acct.last_t) / n, n)
        acct.last_t = t
        acct.generated += n

    def _finish(self, req: GenRequest, acct: "_Accounting", rid: str) -> None:
        acct.finished = True
        self.request_log.append(ServedRequest(rid, acct.arrival, acct.first_t, acct.last_t, acct.generated,
                                              acct.cached))
        c = self.counters
        c["sglang:num_requests_total"] += 1
        c["sglang:prompt_tokens_total"] += req.prompt_tokens
        c["sglang:generation_tokens_total"] += acct.generated
        c["sglang:cached_tokens_total"] += acct.cached
        if acct.last_t is not None:
            self.h_e2e.observe(acct.last_t - acct.arrival)
            if acct.generated > 1:
                self.h_tpot.observe((acct.last_t - acct.first_t) / (acct.generated - 1))

    async def _full(self, req: GenRequest, stream: TokenStream, writer: ResponseWriter,
                    acct: "_Accounting") -> web.Response:
        while not acct.finished:
            for t, ev in await stream.next_batch():
                if ev.error:
                    acct.finished = True
                    return _error(ev.error, 500)
                self._account(acct, t, ev.n_tokens, ev.cached_tokens)
                if ev.finished:
                    self._finish(req, acct, writer.rid)
        return _json(writer.full(acct.generated, acct.cached))

    async def _stream(self, request: web.Request, req: GenRequest, stream: TokenStream, writer: ResponseWriter,
                      acct: "_Accounting") -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        si = self.stream_interval
        sent = 0
        while not acct.finished:
            parts: list[str] = []
            for t, ev in await stream.next_batch():
                if ev.error:
                    acct.finished = True
                    parts.append(writer.error_chunk(ev.error))
                    parts.append("data: [DONE]\n\n")
                    break
                self._account(acct, t, ev.n_tokens, ev.cached_tokens)
                gen = acct.generated
                if ev.finished:
                    self._finish(req, acct, writer.rid)
                    reason = writer.final_reason(gen)
                    u = usage(req.prompt_tokens, gen, acct.cached)
                    if gen > sent:
                        parts.append(writer.chunk(sent, gen, first=sent == 0, finish_reason=reason,
                                                  usage_now=u if req.continuous_usage else None))
                    else:
                        parts.append(writer.finish_chunk(reason))
                    if req.include_usage:
                        parts.append(writer.usage_chunk(u))
                    parts.append("data: [DONE]\n\n")
                    sent = gen
                    break
                if sent == 0 or gen // si > sent // si:  # first token at once, then per stream_interval tokens
                    parts.append(writer.chunk(sent, gen, first=sent == 0,
                                              usage_now=usage(req.prompt_tokens, gen, acct.cached)
                                              if req.continuous_usage else None))
                    sent = gen
            if parts:
                await resp.write("".join(parts).encode())
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ admin
    async def _models(self, _request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": int(self.started_at), "owned_by": "sglang",
            "root": self.model_name, "max_model_len": self.context_len}]})

    async def _health(self, _request: web.Request) -> web.Response:
        if self.healthy:
            return web.Response(status=200)
        return web.Response(status=503, text=f"emulator {self.state}"
                            + (f": engine failed: {self.driver.failure!r}" if self.driver and self.driver.failure else ""))

    def _core_info(self) -> dict[str, Any]:
        """The core's resolved knobs plus scheduler info (its ``server_info`` where it has one)."""
        if hasattr(self.core, "server_info"):
            return dict(self.core.server_info())
        m = self.core.metrics()
        resolved = dict(self.core.resolved_config())
        return {**resolved, "max_total_num_tokens": int(m.get("sglang:max_total_num_tokens", 0)),
                "internal_states": [{"effective_max_running_requests_per_dp": resolved.get("max_running_requests"),
                                     "last_gen_throughput": m.get("sglang:gen_throughput", 0.0),
                                     "avg_spec_accept_length": m.get("sglang:spec_accept_length", 0.0)}]}

    def server_info(self) -> dict[str, Any]:
        """SGLang's /server_info shape: resolved knobs + scheduler info + internal_states + version."""
        info = self._core_info()
        return {
            **info,
            "model_path": self.endpoint.model,
            "served_model_name": self.model_name,
            "launch_command": "autoresearch emulator serve --endpoint " + (self.endpoint.source_path or self.endpoint.name),
            "max_req_input_len": min(self.context_len, self.max_total_num_tokens) - 1,
            "version": endpoint_version(self.endpoint),  # the same string EmulatorEngine.version() reports
        }

    async def _server_info(self, _request: web.Request) -> web.Response:
        return _json(self.server_info())

    async def _model_info(self, _request: web.Request) -> web.Response:
        return _json({"model_path": self.endpoint.model, "served_model_name": self.model_name,
                      "tokenizer_path": None, "is_generation": True, "weight_version": "default"})

    async def _flush_cache(self, request: web.Request) -> web.Response:
        try:
            timeout = float(request.query.get("timeout", "0"))
        except ValueError:
            return web.Response(status=400, text=f"timeout must be a number of seconds, got {request.query['timeout']!r}\n")
        if self.driver is None or not self.healthy:
            return web.Response(status=503, text="emulator not ready\n")
        if self.driver.in_flight:
            if timeout <= 0:
                return web.Response(status=400, text=f"Cache not flushed: {self.driver.in_flight} requests are running "
                                                     "or waiting. (When there are running or waiting requests, the "
                                                     "operation will not be performed; pass ?timeout=S to wait.)\n")
            if not await self.driver.wait_idle(timeout):
                return web.Response(status=400, text="Timed out waiting for idle state.\n")
        if not self.core.flush_cache():
            return web.Response(status=400, text="Cache not flushed: this server has no prefix cache "
                                                 "(disable_radix_cache is set).\n")
        return web.Response(status=200, text=_FLUSH_OK)

    async def _metrics(self, _request: web.Request) -> web.Response:
        fams: list[list[str]] = []
        core_metrics = self.core.metrics()
        for name, value in core_metrics.items():
            fams.append(render_scalar(name, float(value), self._sched_labels))
        for name, value in self.counters.items():
            if name not in core_metrics:
                fams.append(render_scalar(name, value, self._labels, "counter"))
        fams.append(render_scalar("sglang:http_requests_active", self.http_active, self._labels, "gauge"))
        for h in (self.h_ttft, self.h_itl, self.h_tpot, self.h_e2e):
            fams.append(h.render(self._labels))
        return web.Response(text=exposition(fams), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "text/plain; version=0.0.4"})

    # ------------------------------------------------------------------ profiling
    async def _start_profile(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as e:
            return web.Response(status=400, text=f"start_profile body is not valid JSON: {e}\n")
        if not isinstance(body, dict):
            return web.Response(status=400, text="start_profile body must be a JSON object (ProfileReq)\n")
        if self._profile is not None:
            return web.Response(status=400, text="Profiling is already in progress. Call /stop_profile first.\n")
        activities = body.get("activities") or ["CPU", "GPU"]
        unknown = [a for a in activities if a not in _PROFILE_ACTIVITIES]
        if unknown:
            return web.Response(status=400, text=f"profile activities {unknown} are not emulated; "
                                                 f"use {sorted(_PROFILE_ACTIVITIES)}\n")
        for name in ("num_steps", "start_step"):
            v = body.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "num_steps" else 0)):
                return web.Response(status=400, text=f"{name} must be a {'positive' if name == 'num_steps' else 'non-negative'}"
                                                     f" integer, got {v!r}\n")
        out = body.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        self._profile = _Profile(output_dir=Path(out), profile_id=str(body.get("profile_id") or time.time()),
                                 prefix=body.get("profile_prefix"), num_steps=body.get("num_steps"),
                                 start_step=int(body.get("start_step") or 0))
        if self._profile.start_step == 0:
            self.core.start_profile()
            self._profile.active = True
        return web.Response(text="Start profiling.\n")

    async def _stop_profile(self, _request: web.Request) -> web.Response:
        if self._profile is None:
            return web.Response(status=400, text="Profiling is not in progress. Call /start_profile first.\n")
        try:
            files = self._finish_profile()
        except OSError as e:
            return web.Response(status=500, text=f"could not write the profile: {e}\n")
        return web.Response(text="Stop profiling. This will take some time.\n" + "".join(f"{f}\n" for f in files))

    def _on_step(self, _step: Any) -> None:
        p = self._profile
        if p is None:
            return
        p.steps_seen += 1
        if not p.active:
            if p.steps_seen >= p.start_step:
                self.core.start_profile()
                p.active = True
                p.steps_seen = 0
            return
        if p.num_steps is not None and p.steps_seen >= p.num_steps:
            self._finish_profile()

    def _finish_profile(self) -> list[str]:
        """Stop the core's profiler and write one gzipped Chrome trace per TP rank (SGLang's file names)."""
        p = self._profile
        self._profile = None
        if not p.active:
            return []
        trace = self.core.stop_profile()
        stem = (f"{p.prefix}-" if p.prefix else "") + p.profile_id
        return write_profile(trace, p.output_dir, stem, self.tp_size)


@dataclass(frozen=True)
class ServedRequest:
    """One finished request on the engine clock (seconds since the server started)."""
    rid: str
    arrival_s: float
    first_token_s: float
    end_s: float
    output_tokens: int
    cached_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class _Accounting:
    arrival: float
    first_t: float | None = None
    last_t: float | None = None
    generated: int = 0
    cached: int = 0
    finished: bool = False


# ---------------------------------------------------------------------- running it

def _new_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


async def _start_site(server: EmulatorServer, host: str, port: int) -> tuple[web.AppRunner, str]:
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the request in the core.
    runner = web.AppRunner(server.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    shown = host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    return runner, f"http://{shown}:{bound_port}"


class RunningServer:
    """A server on a background thread: ``base_url`` (no /v1) and ``stop()``."""

    def __init__(self, server: EmulatorServer, base_url: str, thread: threading.Thread,
                 loop: asyncio.AbstractEventLoop, stop_event: asyncio.Event):
        self.server = server
        self.base_url = base_url
        self._thread = thread
        self._loop = loop
        self._stop_event = stop_event

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(timeout_s)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_in_thread(server: EmulatorServer, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Start ``server`` on a daemon thread with its own event loop; returns once it accepts connections."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def target() -> None:
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        runner = None
        try:
            stop_event = asyncio.Event()
            runner, url = loop.run_until_complete(_start_site(server, host, port))
            box.update(url=url, loop=loop, stop=stop_event)
            ready.set()
            loop.run_until_complete(stop_event.wait())
        except BaseException as e:  # reported to the caller of serve_in_thread
            box["error"] = e
            ready.set()
        finally:
            if runner is not None:
                loop.run_until_complete(runner.cleanup())
            loop.close()

    thread = threading.Thread(target=target, name=f"emulator-http-{server.endpoint.name}", daemon=True)
    thread.start()
    if not ready.wait(60.0):
        raise RuntimeError("the emulator HTTP server did not start within 60 s")
    if "error" in box:
        raise RuntimeError(f"the emulator HTTP server failed to start on {host}:{port}: {box['error']}") from box["error"]
    return RunningServer(server, box["url"], thread, box["loop"], box["stop"])


def serve(server: EmulatorServer, host: str = "127.0.0.1", port: int = 8000,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve in the foreground until SIGINT or SIGTERM; ``on_ready(base_url)`` once listening."""

    async def main() -> None:
        runner, url = await _start_site(server, host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            if on_ready is not None:
                on_ready(url)
            await stop.wait()
        finally:
            await runner.cleanup()

    with asyncio.Runner(loop_factory=_new_loop) as r:
        r.run(main())
