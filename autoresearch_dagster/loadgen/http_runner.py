"""Owns the open-loop HTTP runner: ``HttpDeployment`` executes load steps against any OpenAI-compatible URL.

Pacing is on absolute deadlines: request i leaves at ``t0 + send_offset_s`` on the shared monotonic
clock. The dispatcher sleeps until shortly before each deadline (event-loop timers have ~1 ms
granularity and wake up to 1 ms early or late), then yields to the loop until the deadline passes
(napping 100 us at a time when the loop has nothing else to do), so lateness never accumulates. Requests are
independent tasks on one pooled aiohttp session; nothing waits for earlier responses (open loop).

Every request ends in exactly one record (ok / error / timeout) with its intended and actual send
offsets, TTFT, every inter-chunk gap, E2E, output tokens (usage, else counted chunks), HTTP status,
error class and bytes; an HTTP error's class is read from its body (``loadgen.failures``: context too
long, unsupported request feature, ...) and the step's ``meta["failures"]`` counts each class with its
first message. Timeouts are bounded (connect, first token, total) and the step stops by
itself at its deadline, recording what is still outstanding as timed out. 429s are failures (their
Retry-After is counted, never obeyed by retrying: that would hide load). The runner watches itself:
a p99 send lag over the threshold or a saturated client core (thread CPU time / wall, excluding the
idle spinning of the pacer) marks the step invalid with the reason. With ``workers > 1`` the
schedule is split by index across processes, each with its own loop, all pacing from one start time.
"""
from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from autoresearch_dagster.engines.base import http_request
from autoresearch_dagster.loadgen.failures import classify_http_error, tally
from autoresearch_dagster.loadgen.prometheus import snapshot
from autoresearch_dagster.loadgen.records import RequestRecord, ScheduledRequest, StepOutcome
from autoresearch_dagster.loadgen.sse import SSEDecoder, StreamTracker

try:  # uvloop where available: cheaper timers and sockets for the pacing loop
    import uvloop
except ImportError:  # pragma: no cover - non-Linux
    uvloop = None

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_IDLE_YIELD_S = 50e-6  # a yield that returned faster than this ran nothing else: pure spinning
_IDLE_NAP_S = 100e-6  # then nap this long (a blocking sleep) rather than spin


@dataclass
class RunnerSettings:
    connect_timeout_s: float = 10.0
    first_token_timeout_s: float | None = None  # None: the step's per-request timeout
    max_send_lag_p99_s: float = 0.010  # above: step invalid (client fell behind its schedule)
    max_cpu_busy: float = 0.90  # above: step invalid (client core saturated)
    pace_margin_s: float = 0.0005  # wake this long before a deadline, then yield until it passes
    workers: int = 1
    # Run the pacing loop in its own process even with one worker. None: automatically when other
    # threads are alive in this process (e.g. a server started in a thread): they share the GIL,
    # and their time slices would show up as send lag.
    isolate: bool | None = None
    scrape_metrics_s: float | None = 2.0  # poll GET /metrics during the step (None: never)
    step_grace_s: float = 1.0  # after the last send + per-request timeout, the step stops
    extra_headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Job:
    """One request as a worker sees it: pre-encoded so nothing is serialized on the send path."""
    request_id: str
    offset: float
    path: str
    body: bytes
    prompt_tokens: int


class _State:
    __slots__ = ("job", "sent", "end", "tracker", "status", "http_status", "error_class", "nbytes",
                 "reason", "retry_after", "handles", "message")

    def __init__(self, job: _Job) -> None:
        self.job = job
        self.sent: float | None = None
        self.end: float | None = None
        self.tracker = StreamTracker()
        self.status = "ok"
        self.http_status: int | None = None
        self.error_class: str | None = None
        self.nbytes = 0
        self.reason: str | None = None
        self.retry_after: str | None = None
        self.handles: list[asyncio.TimerHandle] = []
        self.message: str | None = None  # the server's error message, when it gave one


def _jobs(schedule: list[ScheduledRequest]) -> list[_Job]:
    return [_Job(s.request_id, float(s.send_offset_s), _PATHS[s.api],
                 json.dumps(s.body, separators=(",", ":")).encode(), int(s.prompt_tokens))
            for s in schedule]


class _Executor:
    """Runs one partition of a schedule on the current event loop."""

    def __init__(self, base_url: str, headers: dict[str, str], jobs: list[_Job], settings: RunnerSettings,
                 *, step_id: str, timeout_s: float, scrape: bool) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Content-Type": "application/json", **headers}
        self.jobs = jobs
        self.s = settings
        self.step_id = step_id
        self.timeout_s = timeout_s
        self.first_timeout_s = min(settings.first_token_timeout_s or timeout_s, timeout_s)
        self.scrape = scrape and settings.scrape_metrics_s is not None
        self.spin_idle_s = 0.0
        self.timeseries: list[dict[str, Any]] = []

    async def run(self, t0: float | None) -> dict[str, Any]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.s.connect_timeout_s,
                                        sock_connect=self.s.connect_timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(),
                                         auto_decompress=False) as session:
            self.session = session
            await self.prewarm()
            if t0 is None:
                t0 = time.perf_counter() + 0.05
            return await self._run(t0)

    async def prewarm(self) -> None:
        """One cheap GET before the clock starts: opens a connection and runs the client's lazy
        first-request set-up, which would otherwise land on the first scheduled send."""
        try:
            async with self.session.get(self.base_url + "/v1/models",
                                        timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            pass

    async def _run(self, t0: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self.t0 = t0
        states = [_State(j) for j in self.jobs]
        tasks: list[asyncio.Task] = []
        scraper = loop.create_task(self._scrape()) if self.scrape else None
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        margin = self.s.pace_margin_s
        perf = time.perf_counter
        for st in states:
            deadline = t0 + st.job.offset
            delay = deadline - perf() - margin
            if delay > 0:
                await asyncio.sleep(delay)
            while (remaining := deadline - perf()) > 0:
                a = perf()
                await asyncio.sleep(0)
                d = perf() - a
                if d < _IDLE_YIELD_S:
                    # Nothing else ran: the loop is idle, so block for a few microseconds instead of
                    # burning the core (I/O waits at most this long; TTFTs are milliseconds).
                    self.spin_idle_s += d
                    time.sleep(min(remaining, _IDLE_NAP_S))
            tasks.append(loop.create_task(self._send(st)))
        send_wall = max(perf() - wall0, 1e-9)
        send_cpu = time.thread_time() - cpu0
        last_offset = self.jobs[-1].offset if self.jobs else 0.0
        step_deadline = t0 + last_offset + self.timeout_s + self.s.step_grace_s
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, step_deadline - perf()))
            for task, st in zip(tasks, states):
                if not task.done():
                    st.reason = "step_deadline"
                    task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        if scraper is not None:
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
        wall = max(perf() - wall0, 1e-9)
        cpu = time.thread_time() - cpu0
        messages: dict[str, str] = {}
        for st in states:
            if st.message and st.error_class:
                messages.setdefault(st.error_class, st.message)
        return {
            "records": [vars(self._record(st)) for st in states],
            "messages": messages,
            "retry_after": [st.retry_after for st in states if st.retry_after is not None],
            "cpu_busy_send": max(0.0, send_cpu - self.spin_idle_s) / send_wall,
            "cpu_busy": max(0.0, cpu - self.spin_idle_s) / wall,
            "spin_idle_s": self.spin_idle_s,
            "wall_s": wall,
            "timeseries": self.timeseries,
        }

    def _expire(self, task: asyncio.Task, st: _State, reason: str) -> None:
        if not task.done() and st.reason is None:
            st.reason = reason
            task.cancel()

    async def _send(self, st: _State) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        perf = time.perf_counter
        t0 = self.t0
        tr = st.tracker
        st.handles = [loop.call_later(self.first_timeout_s, self._expire, task, st, "timeout_first_token"),
                      loop.call_later(self.timeout_s, self._expire, task, st, "timeout_total")]
        st.sent = perf() - t0
        try:
            async with self.session.post(self.base_url + st.job.path, data=st.job.body,
                                         headers={**self.headers, "X-Request-Id": st.job.request_id}) as resp:
                st.http_status = resp.status
                if resp.status != 200:
                    body = await resp.content.read(65536)
                    st.nbytes += len(body)
                    st.status = "error"
                    st.error_class, st.message = classify_http_error(resp.status, body)
                    if resp.status == 429:
                        st.retry_after = resp.headers.get("Retry-After", "")
                    return
                dec = SSEDecoder()
                async for chunk in resp.content.iter_any():
                    t = perf() - t0
                    st.nbytes += len(chunk)
                    for ev in dec.feed(chunk):
                        tr.on_event(ev, t)
                    if tr.first_content_t is not None and st.handles[0] is not None:
                        st.handles[0].cancel()
                        st.handles[0] = None
                    if tr.error is not None:
                        break  # after [DONE] keep reading to the end, so the connection is reused
                for ev in dec.finish():
                    tr.on_event(ev, perf() - t0)
            self._classify_stream(st)
        except asyncio.CancelledError:
            st.status = "timeout"
            st.error_class = st.reason or "step_deadline"
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
            st.status = "timeout"
            st.error_class = "timeout_connect" if st.http_status is None else "timeout_read"
        except aiohttp.ClientConnectorError:
            st.status, st.error_class = "error", "connect"
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, ConnectionResetError,
                aiohttp.ClientOSError):
            st.status, st.error_class = "error", "disconnected"
        except aiohttp.ClientResponseError as e:
            st.status, st.error_class = "error", f"http_protocol:{type(e).__name__}"
        except Exception as e:  # noqa: BLE001 - any failure must end in a record, never a crash
            st.status, st.error_class = "error", f"client:{type(e).__name__}"
        finally:
            st.end = perf() - t0
            for h in st.handles:
                if h is not None:
                    h.cancel()

    @staticmethod
    def _classify_stream(st: _State) -> None:
        tr = st.tracker
        if tr.error is not None:
            st.status, st.error_class, st.message = "error", "stream_error", tr.error
        elif tr.n_malformed:
            st.status, st.error_class = "error", "stream_malformed"
        elif not tr.done and tr.usage_tokens is None:
            st.status, st.error_class = "error", "stream_truncated"

    def _record(self, st: _State) -> RequestRecord:
        tr = st.tracker
        ok = st.status == "ok"
        sent = st.sent if st.sent is not None else st.job.offset
        end = st.end if st.end is not None else None
        first = tr.first_content_t
        return RequestRecord(
            request_id=st.job.request_id, step_id=self.step_id, scheduled_s=st.job.offset, sent_s=sent,
            first_token_s=first, end_s=end,
            ttft_s=(first - sent) if first is not None else None,
            itl_s=list(tr.gaps),
            e2e_s=(end - sent) if (ok and end is not None) else None,
            prompt_tokens=st.job.prompt_tokens,
            output_tokens=tr.usage_tokens if tr.usage_tokens is not None else tr.n_content,
            status=st.status, http_status=st.http_status, error_class=st.error_class,
            bytes_received=st.nbytes, cached_tokens=tr.cached_tokens,
        )

    async def _scrape(self) -> None:
        url = self.base_url + "/metrics"
        while True:
            try:
                async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                    if resp.status != 200:
                        return  # no metrics endpoint: stop asking
                    text = await resp.text()
                row: dict[str, Any] = {"t_s": time.perf_counter() - self.t0}
                row.update(snapshot(text))
                self.timeseries.append(row)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                return
            await asyncio.sleep(self.s.scrape_metrics_s)


def _run_loop(coro_factory):
    # A full garbage collection in the middle of a step stalls the pacer for tens of ms (100+ in a
    # big process); the step's objects are freed by reference counting, so collect once before the
    # start time is chosen and pause the collector until the step is over.
    gc_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        if uvloop is not None:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(coro_factory())
        return asyncio.run(coro_factory())
    finally:
        if gc_enabled:
            gc.enable()


def _worker_main(conn, base_url, headers, jobs, settings, step_id, timeout_s, scrape) -> None:
    """Worker process: build the session, report ready, wait for the shared start time, run."""
    from autoresearch_dagster.workers import watch_parent

    watch_parent(os.getppid())  # a killed runner takes its load generators with it
    try:
        ex = _Executor(base_url, headers, jobs, settings, step_id=step_id, timeout_s=timeout_s, scrape=scrape)

        async def main():
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
            timeout = aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s,
                                            sock_connect=settings.connect_timeout_s)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                             cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False) as s:
                ex.session = s
                await ex.prewarm()
                conn.send("ready")
                t0 = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
                return await ex._run(t0)

        conn.send(("ok", _run_loop(main)))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which records the partition as failed
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


class HttpDeployment:
    """A Deployment for any OpenAI-compatible base URL (SGLang, vLLM, the emulator's HTTP server)."""

    def __init__(self, base_url: str, *, model: str | None = None, api_key_env: str | None = None,
                 admin: bool = True, workers: int = 1, settings: RunnerSettings | None = None) -> None:
        base = base_url.rstrip("/")
        self.base_url = base[:-3] if base.endswith("/v1") else base
        self.admin = admin
        self.settings = settings or RunnerSettings()
        if workers != 1:
            self.settings = RunnerSettings(**{**asdict(self.settings), "workers": workers})
        self._headers = dict(self.settings.extra_headers)
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"environment variable {api_key_env} (API key) is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self._model = model
        self._profile_dir: str | None = None

    # ---------------------------------------------------------------- measurement
    # (a single in-process loop, or ``workers`` spawned processes sharing one start time)
    def run_step(self, schedule: list[ScheduledRequest], *, step_id: str, timeout_s: float) -> StepOutcome:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        schedule = sorted(schedule, key=lambda s: s.send_offset_s)
        jobs = _jobs(schedule)
        workers = max(1, min(self.settings.workers, len(jobs) or 1))
        isolate = self.settings.isolate if self.settings.isolate is not None else threading.active_count() > 1
        if workers == 1 and not isolate:
            t0_box: list[float] = []

            async def single():
                ex = _Executor(self.base_url, self._headers, jobs, self.settings, step_id=step_id,
                               timeout_s=timeout_s, scrape=self.admin)
                res = await ex.run(None)
                t0_box.append(ex.t0)
                return res

            parts = [("ok", self._in_fresh_loop(single))]
            t0 = t0_box[0]
        else:
            parts, t0 = self._run_workers(jobs, workers, step_id, timeout_s)
        return self._outcome(schedule, parts, step_id=step_id, t0=t0, workers=workers)

    @staticmethod
    def _in_fresh_loop(factory):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return _run_loop(factory)
        with ThreadPoolExecutor(1) as pool:  # called from async code: run our loop on its own thread
            return pool.submit(_run_loop, factory).result()

    def _run_workers(self, jobs: list[_Job], workers: int, step_id: str, timeout_s: float):
        ctx = mp.get_context("spawn")
        procs, conns = [], []
        for k in range(workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, daemon=True,
                            args=(child, self.base_url, self._headers, jobs[k::workers], self.settings,
                                  step_id, timeout_s, self.admin and k == 0))
            p.start()
            procs.append(p)
            conns.append(parent)
        parts: list[tuple[str, Any]] = [("error", "worker did not start")] * workers
        try:
            for k, c in enumerate(conns):
                if not c.poll(60.0):
                    raise RuntimeError(f"runner worker {k} did not become ready within 60 s")
                msg = c.recv()
                if msg != "ready":
                    raise RuntimeError(f"runner worker {k} failed to start: {msg}")
            t0 = time.perf_counter() + 0.25  # CLOCK_MONOTONIC: the same clock in every process
            for c in conns:
                c.send(t0)
            budget = (jobs[-1].offset if jobs else 0) + timeout_s + self.settings.step_grace_s + 30.0
            for k, c in enumerate(conns):
                if c.poll(max(1.0, t0 + budget - time.perf_counter())):
                    parts[k] = c.recv()
                else:
                    parts[k] = ("error", f"worker {k} did not report within the step deadline")
        finally:
            for p in procs:
                p.join(timeout=5.0)
                if p.is_alive():
                    p.kill()
        return parts, t0

    def _outcome(self, schedule: list[ScheduledRequest], parts, *, step_id: str, t0: float, workers: int) -> StepOutcome:
        by_id: dict[str, RequestRecord] = {}
        invalid: list[str] = []
        busy, retry_after, timeseries = [], [], []
        messages: dict[str, str] = {}
        for k, (status, payload) in enumerate(parts):
            if status != "ok":
                invalid.append(f"runner worker {k} failed: {payload}")
                continue
            for r in payload["records"]:
                by_id[r["request_id"]] = RequestRecord(**r)
            busy.append(payload["cpu_busy_send"])
            retry_after.extend(payload["retry_after"])
            for cls, msg in payload.get("messages", {}).items():
                messages.setdefault(cls, msg)
            timeseries.extend(payload["timeseries"])
        records = []
        for s in schedule:  # a request a failed worker never reported still ends in a record
            rec = by_id.get(s.request_id) or RequestRecord(
                request_id=s.request_id, step_id=step_id, scheduled_s=s.send_offset_s, sent_s=s.send_offset_s,
                first_token_s=None, end_s=None, ttft_s=None, itl_s=[], e2e_s=None,
                prompt_tokens=s.prompt_tokens, output_tokens=0, status="error", error_class="runner_worker_failed")
            records.append(rec)
        lags = np.asarray([r.sent_s - r.scheduled_s for r in records if r.error_class != "runner_worker_failed"])
        lag_p50, lag_p99, lag_max = ((float(np.percentile(lags, 50)), float(np.percentile(lags, 99)),
                                      float(lags.max())) if lags.size else (0.0, 0.0, 0.0))
        if lag_p99 > self.settings.max_send_lag_p99_s:
            invalid.append(f"client send lag p99 {lag_p99 * 1e3:.1f} ms > {self.settings.max_send_lag_p99_s * 1e3:g} ms "
                           "(the client fell behind its schedule)")
        if busy and max(busy) > self.settings.max_cpu_busy:
            invalid.append(f"client core saturated ({max(busy) * 100:.0f}% busy > "
                           f"{self.settings.max_cpu_busy * 100:.0f}%); use more --workers")
        ends = [r.end_s for r in records if r.end_s is not None]
        return StepOutcome(
            step_id=step_id, records=records, duration_s=max(ends) if ends else 0.0,
            client_invalid_reasons=invalid, engine_timeseries=sorted(timeseries, key=lambda r: r["t_s"]),
            meta={"t0_monotonic": t0, "workers": workers, "send_lag_p50_ms": lag_p50 * 1e3,
                  "send_lag_p99_ms": lag_p99 * 1e3, "send_lag_max_ms": lag_max * 1e3,
                  "client_cpu_busy": busy, "n_retry_after": len(retry_after), "base_url": self.base_url,
                  "failures": tally(records, messages)},
        )

    # ---------------------------------------------------------------- admin
    def _admin(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        return http_request(self.base_url + path, method=method, headers=headers, body=data, timeout=timeout)

    def served_model(self) -> str:
        """The model name to send: the one given, else the first of GET /v1/models."""
        if self._model:
            return self._model
        status, body = self._admin("GET", "/v1/models")
        try:
            self._model = json.loads(body)["data"][0]["id"] if status == 200 else "default"
        except (ValueError, KeyError, IndexError, TypeError):
            self._model = "default"
        return self._model

    def health(self) -> bool:
        return self._admin("GET", "/health", timeout=30.0)[0] == 200 or self._admin("GET", "/v1/models")[0] == 200

    def flush_cache(self) -> bool:
        """POST /flush_cache (waiting up to 30 s for the server to go idle); False where there is none."""
        if not self.admin:
            return False
        status, _ = self._admin("POST", "/flush_cache?timeout=30", timeout=40.0)
        return status == 200

    def server_info(self) -> dict[str, Any]:
        for path in ("/server_info", "/get_server_info"):
            status, body = self._admin("GET", path)
            if status == 200:
                try:
                    info = json.loads(body)
                    return info if isinstance(info, dict) else {}
                except ValueError:
                    return {}
        return {}

    def metrics_text(self) -> str:
        status, body = self._admin("GET", "/metrics")
        return body.decode("utf-8", "replace") if status == 200 else ""

    def start_profile(self, output_dir: str) -> None:
        self._profile_dir = output_dir
        status, body = self._admin("POST", "/start_profile", {"output_dir": output_dir}, timeout=60.0)
        if status not in (200, 404):
            raise RuntimeError(f"start_profile failed: HTTP {status} {body[:200]!r}")

    def stop_profile(self) -> list[str]:
        status, _ = self._admin("POST", "/stop_profile", timeout=120.0)
        if status != 200 or not self._profile_dir or not Path(self._profile_dir).is_dir():
            return []  # no profiler, or the trace was written on another machine
        return sorted(str(p) for p in Path(self._profile_dir).rglob("*")
                      if p.name.endswith((".json", ".json.gz", ".trace.json.gz")))

    def close(self) -> None:
        """Nothing held between steps: each step opens and closes its own session."""
