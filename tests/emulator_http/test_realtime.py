"""The real-time driver: absolute deadlines without drift, a continuous engine timeline, idling, aborts, engine failure."""
from __future__ import annotations

import asyncio
import time

import pytest

from .helpers import ScriptedCore
from autoresearch_dagster.emulator.realtime import RealtimeDriver

pytestmark = pytest.mark.timeout(30)


async def _collect(stream):
    events = []
    while True:
        batch = await stream.next_batch()
        events.extend(batch)
        if batch[-1][1].finished:
            return events


def test_no_drift_over_hundreds_of_steps_and_a_continuous_timeline():
    core = ScriptedCore(prefill_s=0.02, decode_s=0.005)

    async def go():
        d = RealtimeDriver(core)
        await d.start()
        t0 = time.perf_counter()
        s = d.submit("a", 100, 300, [], 64)
        events = await _collect(s)
        wall = time.perf_counter() - t0
        await d.stop()
        return s.arrival_s, events, wall

    arrival, events, wall = asyncio.run(go())
    expected = 0.02 + 299 * 0.005  # 1.515 s of emulated GPU time
    assert abs(wall - expected) <= 0.05 * expected  # relative sleeps would have drifted by ~1 ms per step
    stamps = [t for t, _ in events]
    # engine time is continuous: each step starts exactly where the previous one ended
    assert stamps[0] == pytest.approx(arrival + 0.02, abs=1e-9)
    assert stamps[-1] == pytest.approx(arrival + expected, abs=1e-6)
    assert sum(ev.n_tokens for _, ev in events) == 300
    assert core.now_calls[1:] == pytest.approx(stamps[:len(core.now_calls) - 1], abs=1e-9)


def test_idle_wakeup_abort_and_arrivals_never_after_the_pending_step_end():
    core = ScriptedCore(prefill_s=0.05, decode_s=0.01)

    async def go():
        d = RealtimeDriver(core)
        await d.start()
        await asyncio.sleep(0.05)  # idle: nothing runs, nothing is asked twice
        asks_while_idle = len(core.now_calls)
        a = d.submit("a", 10, 50, [], 64)
        await asyncio.sleep(0.02)  # inside a's prefill step
        b = d.submit("b", 10, 5, [], 64, received_s=d.now() - 0.001)
        first_a = await a.next_batch()
        d.abort("a")
        events_b = await _collect(b)
        await asyncio.sleep(0.03)
        idle_after = d.in_flight
        await d.stop()
        return asks_while_idle, a, b, first_a, events_b, idle_after

    asks_while_idle, a, b, first_a, events_b, idle_after = asyncio.run(go())
    assert asks_while_idle <= 1
    assert a.arrival_s < b.arrival_s <= first_a[0][0]  # b arrived during a's step, before its end
    assert core.aborted == ["a"] and sum(ev.n_tokens for _, ev in events_b) == 5
    assert idle_after == 0


def test_engine_failure_fails_requests_and_reports_unhealthy():
    class Broken(ScriptedCore):
        def next_step(self, now):
            raise ZeroDivisionError("cost model bug")

    async def go():
        d = RealtimeDriver(Broken())
        await d.start()
        s = d.submit("x", 10, 5, [], 64)
        events = await _collect(s)
        await asyncio.sleep(0)
        running = d.running
        await d.stop()
        return events, running

    events, running = asyncio.run(go())
    assert "cost model bug" in events[-1][1].error and not running


def test_fixed_request_latency_as_in_virtual_time():
    """A request reaches an idle engine request_in_s after it arrives (the driver wakes for it, no other
    arrival needed) and every event reaches its stream request_out_s after its step ends; the engine's
    own timeline (steps back to back) is unchanged by the delivery delay."""
    core = ScriptedCore(prefill_s=0.02, decode_s=0.01, request_in_s=0.03, request_out_s=0.015)

    async def go():
        d = RealtimeDriver(core)
        await d.start()
        await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        s = d.submit("a", 10, 5, [], 64)
        events = await _collect(s)
        wall = time.perf_counter() - t0
        await d.stop()
        return s.arrival_s, events, wall

    arrival, events, wall = asyncio.run(go())
    assert core.now_calls[0] == pytest.approx(arrival + 0.03, abs=1e-9)  # prefill starts when it is ready
    assert core.now_calls[1:] == pytest.approx([arrival + 0.03 + 0.02 + 0.01 * k for k in range(4)], abs=1e-9)
    stamps = [t for t, _ in events]
    first = arrival + 0.03 + 0.02 + 0.015
    assert stamps[0] == pytest.approx(first, abs=1e-9)
    assert stamps[-1] == pytest.approx(first + 4 * 0.01, abs=1e-9)
    assert stamps[-1] - arrival - 0.002 <= wall <= stamps[-1] - arrival + 0.05  # on the wall clock, never early
