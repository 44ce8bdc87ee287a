"""Owns the lifetime of local worker processes: a worker never outlives the process that started it.

``ProcessPoolExecutor`` workers block on a queue whose write end they hold themselves, so when the
parent is killed (SIGKILL, the kernel's OOM killer) nothing tells them to stop and they live on as
orphans. Every pool in the project starts its workers through :func:`pool_initializer`, which
records the parent's pid and starts a daemon thread that ends the worker as soon as its parent is
gone (its parent pid changes: it was re-parented to init or a subreaper).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

POLL_S = 0.5


def _watch(parent: int, poll_s: float) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(70)  # the parent is gone: nothing will read this worker's results
        time.sleep(poll_s)


def watch_parent(parent: int, poll_s: float = POLL_S) -> None:
    """In a worker: exit when the process ``parent`` is no longer this process's parent."""
    if os.getppid() != parent:
        os._exit(70)
    threading.Thread(target=_watch, args=(parent, poll_s), daemon=True, name="parent-watch").start()


def _guarded(parent: int, init: Callable[..., Any] | None, args: tuple) -> None:
    watch_parent(parent)
    if init is not None:
        init(*args)


def pool_initializer(init: Callable[..., Any] | None = None, args: tuple = ()) -> dict[str, Any]:
    """Keyword arguments for ``ProcessPoolExecutor``: ``init(*args)`` after the parent watch starts."""
    return {"initializer": _guarded, "initargs": (os.getpid(), init, tuple(args))}
