"""Owns the real-time driver: one asyncio task that runs an ``EngineCore`` against the wall clock.

The core is time-agnostic; this driver gives it time. It asks ``step = core.next_step(now)``
for every replica that is free, waits until the earliest ``step.start_s + step.duration_s`` on an
absolute monotonic clock (relative sleeps would accumulate the event loop's lateness), then hands
that step's events to per-request streams and asks again. With ``dp_size > 1`` several replicas'
steps are in flight at once (a heap ordered by end time). With nothing to run it waits for
``submit``, which also wakes it so an idle replica starts a new request at once.

Engine time is kept continuous while the emulated GPU is busy: after a step ends, the next one
starts at that end (as a real scheduler loop would), not at the moment this event loop got round
to it, so timer jitter does not accumulate into slower emulated steps. A request that arrives
while the loop is late enters the core no later than the pending step's end. Only when the loop
falls more than ``resync_s`` behind (a stalled process) does engine time jump to the wall clock.
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
        self._new_arrival: float | None = None  # earliest arrival not yet seen by the scheduler
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
        self._new_arrival = t if self._new_arrival is None else min(self._new_arrival, t)
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

    def _schedule(self, t: float) -> None:
        """Start a step on every replica that is free at engine time ``t``."""
        core = self.core
        while True:
            free = core.next_free_s()
            if free is None or free > t:
                return
            step = core.next_step(t)
            if step is None:
                return
            self._seq += 1
            heapq.heappush(self._heap, (step.start_s + step.duration_s, self._seq, step))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        heap = self._heap
        try:
            while True:
                real = self.now()
                while heap and heap[0][0] <= real:
                    end, _, step = heapq.heappop(heap)
                    self._deliver(step, end)
                    if real - end < self.resync_s:
                        self._schedule(end)
                    else:
                        self.late_resyncs += 1
                        self._schedule(real)
                # an idle replica starts a new request from its arrival, not from when this loop woke
                first_new, self._new_arrival = self._new_arrival, None
                self._schedule(real if first_new is None else min(real, first_new))
                self._waiter = loop.create_future()
                if heap:
                    remaining = heap[0][0] - self.now()
                    if remaining <= 0:
                        await asyncio.sleep(0)  # let handlers run while catching up
                        continue
                    # timers have ~1 ms granularity: the loop re-checks against the absolute deadline
                    handle = loop.call_later(remaining, self._wake)
                    await self._waiter
                    handle.cancel()
                else:
                    await self._waiter
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the engine itself failed: fail every request, report unhealthy
            log.exception("emulator engine loop failed")
            self.failure = e
            for s in list(self._streams.values()):
                s._push(self.now(), TokenEvent(s.rid, 0, True, error=f"emulator engine failed: {e!r}"))
            self._streams.clear()
            self._idle.set()

    def _deliver(self, step: Step, end: float) -> None:
        self.steps += 1
        streams = self._streams
        for ev in step.events:
            s = streams.get(ev.rid)
            if s is None:
                continue  # aborted by its client
            s._push(end, ev)
            if ev.finished:
                del streams[ev.rid]
        if not streams:
            self._idle.set()
        self.core.pop_finished()  # the core keeps finished requests for the virtual driver; nobody reads them here
        if self.on_step is not None:
            self.on_step(step)
