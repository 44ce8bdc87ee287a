"""Owns parallel execution of independent runs on local worker processes (the emulator's virtual GPUs).

A run is a fresh deployment measured once, so runs of one stage (both arms of an experiment, the
noise floor's repeats, a surrogate's candidates) do not depend on each other. When the engine can be
rebuilt in another process (``engine.worker_recipe()``: the emulator in virtual time) they are
measured ``workers`` at a time on a persistent process pool; any other engine (a local SGLang server,
Modal, an external URL) holds real resources and runs them one after another in this process. Either
way each run goes through ``runs.execute_run`` and comes back as the same ``RunRecord``.

Workers are started with ``spawn`` (a Dagster step or a thread of the caller may hold locks a
``fork`` would copy) and kept for the life of the process; each caches the replay pools it read.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from autoresearch_dagster.spec import EndpointSpec
from autoresearch_dagster.workers import pool_initializer

_POOLS: dict[int, ProcessPoolExecutor] = {}
_LOCK = threading.Lock()
_W: dict[str, Any] = {}  # worker side: replay pools and engines by key


@dataclass(frozen=True)
class RunTask:
    """One run to measure: everything ``execute_run`` takes except the engine and the pool objects."""
    config: dict[str, Any]
    arm: str
    run_index: int
    seed: int
    purpose: str
    mode: str
    reference_rps: float | None = None
    reference_fraction: float | None = None
    capacity_start: float | None = None  # a capacity estimate the search starts at (runs.warm_started); None: cold


def max_workers() -> int:
    return max(1, os.cpu_count() or 1)


def _executor(workers: int) -> ProcessPoolExecutor:
    with _LOCK:
        ex = _POOLS.get(workers)
        if ex is None:
            ex = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), **pool_initializer())
            _POOLS[workers] = ex
        return ex


@atexit.register
def shutdown() -> None:
    """Stop every worker pool (also called by tests that want a clean process)."""
    with _LOCK:
        for ex in _POOLS.values():
            ex.shutdown(wait=False, cancel_futures=True)
        _POOLS.clear()


def _worker_engine(recipe: tuple) -> Any:
    key = repr(recipe)
    if key not in _W:
        kind, endpoint_json, noise, efficiency = recipe
        if kind != "emulator":
            raise ValueError(f"no worker recipe for engine {kind!r}")
        from autoresearch_dagster.engines.emulator import EmulatorEngine

        _W[key] = EmulatorEngine(EndpointSpec.model_validate_json(endpoint_json), noise=noise, efficiency=efficiency)
    return _W[key]


def _worker_pool(path: str) -> Any:
    key = f"pool:{path}:{os.stat(path).st_mtime_ns}"
    if key not in _W:
        from autoresearch_dagster.pool.schema import read_pool

        _W[key] = read_pool(path)
    return _W[key]


def _run_in_worker(recipe: tuple, endpoint_json: str, pool_path: str, settings: Any, task: RunTask) -> Any:
    from autoresearch_dagster.experiments.runs import execute_run, warm_started

    endpoint = EndpointSpec.model_validate_json(endpoint_json)
    return execute_run(endpoint, task.config, _worker_pool(pool_path), engine=_worker_engine(recipe), arm=task.arm,
                       run_index=task.run_index, seed=task.seed, purpose=task.purpose,
                       settings=warm_started(settings, task.capacity_start),
                       mode=task.mode, reference_rps=task.reference_rps, reference_fraction=task.reference_fraction)


def _call_in_worker(fn: Callable, args: tuple) -> Any:
    return fn(*args)


def worker_recipe(engine: Any) -> tuple | None:
    recipe = getattr(engine, "worker_recipe", None)
    return recipe() if callable(recipe) else None


def run_many(endpoint: EndpointSpec, pool: Any, tasks: list[RunTask], *, engine: Any, settings: Any,
             workers: int = 1, on_done: Callable[[Any], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> list[Any]:
    """Measure ``tasks`` and return their RunRecords in task order; ``on_done`` sees each one as it is
    stored (in task order). Parallel only when the engine has a worker recipe, the pool lives in a file
    and ``workers`` > 1. ``should_stop`` is asked before each run one at a time (a budget), and before
    the whole batch when it runs in parallel; runs it stops are not measured."""
    from autoresearch_dagster.experiments.runs import execute_run, warm_started

    recipe = worker_recipe(engine)
    path = getattr(pool, "path", None)
    workers = min(workers, max_workers(), len(tasks))
    if workers <= 1 or recipe is None or not path:
        out = []
        for t in tasks:
            if should_stop is not None and should_stop():
                break
            rec = execute_run(endpoint, t.config, pool, engine=engine, arm=t.arm, run_index=t.run_index, seed=t.seed,
                              purpose=t.purpose, settings=warm_started(settings, t.capacity_start), mode=t.mode,
                              reference_rps=t.reference_rps,
                              reference_fraction=t.reference_fraction)
            out.append(rec)
            if on_done:
                on_done(rec)
        return out
    if should_stop is not None and should_stop():
        return []
    ex = _executor(workers)
    ep_json = endpoint.model_dump_json()
    futures = [ex.submit(_run_in_worker, recipe, ep_json, str(path), settings, t) for t in tasks]
    out = []
    for f in futures:
        rec = f.result()
        out.append(rec)
        if on_done:
            on_done(rec)
    return out


def map_calls(fn: Callable, arg_list: list[tuple], *, workers: int) -> list[Any]:
    """``[fn(*args) for args in arg_list]`` on the worker pool (``fn`` must be a module-level function)."""
    workers = min(workers, max_workers(), len(arg_list))
    if workers <= 1:
        return [fn(*a) for a in arg_list]
    ex = _executor(workers)
    return [f.result() for f in [ex.submit(_call_in_worker, fn, a) for a in arg_list]]
