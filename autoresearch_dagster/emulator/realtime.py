"""Owns the real-time driver: one asyncio task that runs an ``EngineCore`` against the wall clock.

The core is time-agnostic; this driver gives it time. It asks ``step = core.next_step(t)`` for
every replica that is free at ``t = core.next_free_s()``, waits until the earliest
``step.start_s + step.duration_s`` or the next replica's free time on an absolute monotonic clock
(relative sleeps would accumulate the event loop's lateness), then hands that step's events to
per-request streams and asks again. With ``dp_size > 1`` several replicas' steps are in flight at
once (a heap ordered by end time). With nothing to run it waits for ``submit``, which also wakes it
so an idle replica starts a new request at once.

The driver reproduces what the virtual-time driver (``sim.simulate``) sees, mechanism for mechanism:
a submitted request reaches the scheduler ``Efficiency.request_in_s`` after its arrival (the core's
``ready`` time, which is the idle replica's ``next_free_s``, so the loop wakes for it), and each
step's events reach their streams ``request_out_s`` after the step ends (the core's client-visible
``first_s``/``token_times`` carry the same delay); the engine frees a finished request's slot at the
step's end, as in virtual time.

Engine time is kept continuous while the emulated GPU is busy: a replica's next step starts at its
``busy_until`` (the previous step's end, or the moment a request reached the scheduler), not at the
moment this event loop got round to it, so timer jitter does not accumulate into slower emulated
steps. A request that arrives while the loop is late enters the core no later than the pending
step's end. Only when the loop falls more than ``resync_s`` behind (a stalled process) does engine
time jump to the wall clock.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from typing import Any, Callable

from autoresearch_dagster.emulator.core import EmuRequest, Step, TokenEvent

log = logging.getLogger(__name__)
MAX_BACKDATE_S = 0.02  # a request's arrival may precede its submission by at most this much


class TokenStream:
    """Delivered events of one request, in order, as ``(engine_time_s, TokenEvent)``."""

    __slots__ = ("rid", "arrival_s", "_items", "_waiter", "closed")

    def __init__(self, rid: str, arrival_s: float):
        self.rid = rid
        self.arrival_s = arrival_s
        self._items: deque[tuple[float, TokenEvent]] = deque()
        self._waiter: asyncio.Future | None = None
        self.closed = False

    def _push(self, t: float, ev: TokenEvent) -> None:
        self._items.append((t, ev))
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next_batch(self) -> list[tuple[float, TokenEvent]]:
        """Everything delivered since the last call (waits for at least one event)."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self._items)
        self._items.clear()
        return items


class RealtimeDriver:
    """Drives ``core`` in real time; ``submit`` / ``abort`` are called from handlers on the same loop."""

    def __init__(self, core: Any, *, resync_s: float = 0.05, on_step: Callable[[Step], None] | None = None):
        self.core = core
        self.resync_s = resync_s
        self.on_step = on_step
        self._t0 = time.monotonic()
        self._streams: dict[str, TokenStream] = {}
        self._heap: list[tuple[float, int, Step]] = []  # steps in flight: (end, seq, step)
        self._seq = 0
        self._out_s = float(core.request_out_s)  # a token's way from its step to the client
        self._outbox: list[tuple[float, int, list[TokenEvent]]] = []  # ended steps' events not yet at the client
        self._waiter: asyncio.Future | None = None
        self._idle: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.steps = 0
        self.late_resyncs = 0
        self.failure: BaseException | None = None

    # ---- clock
    def now(self) -> float:
        """Engine time: seconds since the driver was created, on the monotonic clock."""
        return time.monotonic() - self._t0

    def _arrival_time(self, received_s: float | None) -> float:
        now = self.now()
        # backdating covers request parsing, not a long upload the engine could not have overlapped
        t = now if received_s is None else min(now, max(received_s, now - MAX_BACKDATE_S))
        return min(t, self._heap[0][0]) if self._heap else t

    # ---- lifecycle
    async def start(self) -> None:
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = asyncio.create_task(self._run(), name="emulator-realtime-driver")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for s in list(self._streams.values()):
            s._push(self.now(), TokenEvent(s.rid, 0, True, error="server shutting down"))
        self._streams.clear()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and self.failure is None

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def has(self, rid: str) -> bool:
        return rid in self._streams

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is in flight (immediately when none is), False after ``timeout_s``."""
        if not self._streams:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return not self._streams

    # ---- requests
    def submit(self, rid: str, prompt_tokens: int, output_tokens: int, block_hashes: list[int],
               block_tokens: int, *, received_s: float | None = None) -> TokenStream:
        """Hand a request to the core. ``received_s`` (engine time the HTTP request came in) is its
        arrival: the server's own parsing time is not emulated GPU time, so it is not charged to TTFT."""
        if not self.running:
            raise RuntimeError(f"the emulator engine is not running ({self.failure!r})")
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight")
        t = self._arrival_time(received_s)
        stream = TokenStream(rid, t)
        self._streams[rid] = stream
        self._idle.clear()
        self.core.add_request(EmuRequest(rid=rid, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                         block_hashes=block_hashes, block_tokens=block_tokens, arrival_s=t), t)
        self._wake()
        return stream

    def abort(self, rid: str) -> None:
        """Client went away: drop its stream and free its engine slot."""
        stream = self._streams.pop(rid, None)
        if stream is None:
            return
        stream.closed = True
        self.core.abort(rid)
        if not self._streams:
            self._idle.set()

    # ---- the loop
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _advance(self, real: float) -> None:
        """Bring the engine up to wall-clock engine time ``real``, in engine-time order: end every step due
        by then (its events go to the outbox) and start a step on every replica free by then."""
        core, heap = self.core, self._heap
        while True:
            due = heap[0][0] if heap else None
            free = core.next_free_s()
            if due is not None and due <= real and (free is None or due <= free):
                end, seq, step = heapq.heappop(heap)
                self.steps += 1
                # events built at the step's end (the requests' state then), delivered request_out_s later
                heapq.heappush(self._outbox, (end + self._out_s, seq, step.events))
                self.core.pop_finished()  # kept for the virtual driver; nobody reads them here
                if self.on_step is not None:
                    self.on_step(step)
                continue
            if free is None or free > real:
                return
            if real - free >= self.resync_s:
                self.late_resyncs += 1
                free = real
            step = core.next_step(free)
            if step is None:
                return
            self._seq += 1
            heapq.heappush(heap, (step.start_s + step.duration_s, self._seq, step))

    def _next_wake(self) -> float | None:
        """Engine time of the next thing to do: a step's end, a replica's free time or an outbox delivery."""
        times = [self._heap[0][0]] if self._heap else []
        free = self.core.next_free_s()
        if free is not None:
            times.append(free)
        if self._outbox:
            times.append(self._outbox[0][0])
        return min(times) if times else None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        outbox = self._outbox
        try:
            while True:
                real = self.now()
                self._advance(real)
                while outbox and outbox[0][0] <= real:
                    t, _, events = heapq.heappop(outbox)
                    self._deliver(events, t)
                self._waiter = loop.create_future()
                wake = self._next_wake()
                if wake is None:
                    await self._waiter
                    continue
                remaining = wake - self.now()
                if remaining <= 0:
                    await asyncio.sleep(0)  # let handlers run while catching up
                    continue
                # timers have ~1 ms granularity: the loop re-checks against the absolute deadline
                handle = loop.call_later(remaining, self._wake)
                await self._waiter
                handle.cancel()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the engine itself failed: fail every request, report unhealthy
            log.exception("emulator engine loop failed")
            self.failure = e
            for s in list(self._streams.values()):
                s._push(self.now(), TokenEvent(s.rid, 0, True, error=f"emulator engine failed: {e!r}"))
            self._streams.clear()
            self._idle.set()

    def _deliver(self, events: list[TokenEvent], t: float) -> None:
        """Hand a step's events to their streams at client time ``t`` (its end + ``request_out_s``)."""
        streams = self._streams
        for ev in events:
            s = streams.get(ev.rid)
            if s is None:
                continue  # aborted by its client
            s._push(t, ev)
            if ev.finished:
                del streams[ev.rid]
        if not streams:
            self._idle.set()
