"""Owns the emulator's exhaustive grid search: capacity at SLA for every point of a documented knob grid.

This is the ground truth the campaign benchmarks measure against: for one endpoint (model,
hardware, SLA, replay pool) it measures the capacity of the endpoint's own server config (the
"default") and of every combination in ``DEFAULT_GRID`` with the runner's ``find_capacity`` on the
virtual-time emulator, all with the same seeds (common random numbers), on worker processes.

The grid covers the levers SGLang users tune first: the prefill-decode interval, mixed chunks,
the chunk size, the cache-aware policy, fp8 weights and fp8 KV, each at the values the search
space tries (``spec.KNOBS[...].search_values``), so the grid is the ground truth of the space the
proposers search. ``QUICK_GRID`` is the subset the benchmark runs: no chunk size, and each knob
at its first and its middle search value (the default end and a moderate setting, not the extreme).
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.workers import pool_initializer
from autoresearch_dagster.spec import KNOBS, EndpointSpec, SpecError, is_lossy, knob, validate_server_config


def knob_grid(names: Iterable[str], *, quick: bool = False) -> dict[str, tuple]:
    """Each knob's search values from ``spec.KNOBS``; ``quick``: only the first and the middle one."""
    grid: dict[str, tuple] = {}
    for name in names:
        values = knob(name).search_values
        if not values:
            raise SpecError(f"grid knob {name!r} has no search values in spec.KNOBS")
        grid[name] = (values[0], values[len(values) // 2]) if quick and len(values) > 2 else values
    return grid


DEFAULT_GRID = knob_grid(("prefill_decode_interval", "enable_mixed_chunk", "chunked_prefill_size", "schedule_policy",
                          "quantization", "kv_cache_dtype"))
QUICK_GRID = knob_grid(("prefill_decode_interval", "enable_mixed_chunk", "schedule_policy", "quantization",
                        "kv_cache_dtype"), quick=True)


def grid_size(grid: dict[str, tuple]) -> int:
    return math.prod(len(v) for v in grid.values())


@dataclass
class GridSettings:
    step_duration_s: float = 60.0
    min_completed: int = 100
    start_rps: float = 4.0  # well above 1 req/s: steps at very low rates barely reach min_completed
    resolution: float = 0.03
    warmup_s: float = 0.0
    max_steps: int = 20
    seed: int = 0
    workers: int = 2


@dataclass
class GridResult:
    endpoint: str
    sla: str
    grid: dict[str, list]
    default: dict[str, Any]
    best: dict[str, Any]
    best_lossless: dict[str, Any]
    points: list[dict[str, Any]]
    settings: dict[str, Any]
    pool_hash: str
    wall_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        d = self.default["capacity_rps"]
        return self.best["capacity_rps"] / d if d > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["best_over_default"] = self.ratio
        return out


def grid_points(grid: dict[str, tuple], base: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every combination of ``grid`` over ``base`` (validated; unset values dropped)."""
    for name, values in grid.items():
        k = KNOBS.get(name)
        if k is None:
            raise SpecError(f"grid knob {name!r} is not a server knob")
        for v in values:
            k.validate(v)
    names = list(grid)
    out = []
    for combo in itertools.product(*(grid[n] for n in names)):
        cfg = {**(base or {}), **dict(zip(names, combo))}
        out.append(validate_server_config({k: v for k, v in cfg.items() if v is not None}))
    return out


# ------------------------------------------------------------------ worker side
_W: dict[str, Any] = {}


def _init_worker(endpoint_json: str, pool_path: str) -> None:
    from autoresearch_dagster.pool.schema import read_pool

    _W["endpoint"] = EndpointSpec.model_validate_json(endpoint_json)
    _W["pool"] = read_pool(pool_path)


def _capacity(config: dict[str, Any], s: GridSettings) -> dict[str, Any]:
    return measure_point(_W["endpoint"], _W["pool"], config, s)


def measure_point(endpoint: EndpointSpec, pool: Any, config: dict[str, Any], s: GridSettings) -> dict[str, Any]:
    """Capacity of one config on the virtual-time emulator (the runner's search, fixed seeds)."""
    from autoresearch_dagster.engines.emulator import EmulatorEngine
    from autoresearch_dagster.measure.capacity import find_capacity
    from autoresearch_dagster.measure.profiles import CapacitySettings

    t0 = time.perf_counter()
    dep = EmulatorEngine(endpoint).deploy(config, seed=s.seed)
    cs = CapacitySettings(step_duration_s=s.step_duration_s, min_completed=s.min_completed, start_rps=s.start_rps,
                          resolution=s.resolution, warmup_s=s.warmup_s, max_steps=s.max_steps)
    res = find_capacity(dep, pool, endpoint.sla, gpus=endpoint.gpus, model=endpoint.model, settings=cs, seed=s.seed)
    last_pass = [st for st in res.steps if st.passed and st.rate_rps == res.capacity_rps]
    limiting = [t for st in res.steps if not st.passed for t in st.failed_terms][-1:] or [""]
    return {"config": config, "capacity_rps": res.capacity_rps, "capacity_rps_per_gpu": res.capacity_rps_per_gpu,
            "valid": res.valid, "invalid_reasons": res.invalid_reasons, "lossy": is_lossy(config),
            "limited_by": limiting[0],
            "at_capacity": ({"ttft_p99_ms": last_pass[-1].ttft_ms.get("p99"), "tpot_p99_ms": last_pass[-1].tpot_ms.get("p99"),
                             "itl_p99_ms": last_pass[-1].itl_ms.get("p99")} if last_pass else None),
            "n_steps": len(res.steps), "wall_s": time.perf_counter() - t0}


# ------------------------------------------------------------------ driver

def run_grid(endpoint: EndpointSpec, pool_path: str | Path, *, grid: dict[str, tuple] | None = None,
             settings: GridSettings | None = None,
             progress: Callable[[dict[str, Any], int, int], None] | None = None) -> GridResult:
    """Measure the endpoint's own config and every grid point; returns the ranked result."""
    from autoresearch_dagster.pool.schema import read_pool

    s = settings or GridSettings()
    grid = grid or DEFAULT_GRID
    base = dict(endpoint.server_config)
    default_cfg = validate_server_config(base)
    points = grid_points(grid, base)
    todo = [default_cfg] + [p for p in points if p != default_cfg]
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    pool_hash = read_pool(pool_path).content_hash
    if s.workers <= 1:
        pool = read_pool(pool_path)
        for i, cfg in enumerate(todo):
            results.append(measure_point(endpoint, pool, cfg, s))
            if progress:
                progress(results[-1], i + 1, len(todo))
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=s.workers, mp_context=mp.get_context("spawn"),
                                 **pool_initializer(_init_worker, (endpoint.model_dump_json(), str(pool_path)))) as ex:
            futures = [ex.submit(_capacity, cfg, s) for cfg in todo]
            for i, f in enumerate(futures):
                results.append(f.result())
                if progress:
                    progress(results[-1], i + 1, len(todo))
    default = results[0]
    grid_results = [r for r in results if r["config"] in points] or results
    best = max(results, key=lambda r: r["capacity_rps"])
    lossless = [r for r in results if not r["lossy"]]
    best_lossless = max(lossless, key=lambda r: r["capacity_rps"]) if lossless else default
    notes = []
    if any(not r["valid"] for r in results):
        notes.append(f"{sum(not r['valid'] for r in results)} point(s) had invalid capacity searches (see points[].invalid_reasons)")
    return GridResult(endpoint=endpoint.name, sla=str(endpoint.sla), grid={k: list(v) for k, v in grid.items()},
                      default=_brief(default), best=_brief(best), best_lossless=_brief(best_lossless),
                      points=sorted(grid_results, key=lambda r: -r["capacity_rps"]), settings=asdict(s),
                      pool_hash=pool_hash, wall_s=time.perf_counter() - t0, notes=notes)


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    return {"config": r["config"], "capacity_rps": r["capacity_rps"], "capacity_rps_per_gpu": r["capacity_rps_per_gpu"],
            "lossy": r["lossy"], "limited_by": r["limited_by"], "at_capacity": r["at_capacity"]}


def write_grid(result: GridResult, out_dir: str | Path) -> Path:
    """Write ``out_dir/grid.json`` atomically."""
    return write_json(Path(out_dir) / "grid.json", result.to_dict())


def ensure_pool(endpoint: EndpointSpec, out_dir: str | Path, pool: str | Path | None = None) -> Path:
    """The replay pool to search with: the given one, or one built from the endpoint's logs under out_dir/pool."""
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.pool.build import build_pool

    if pool:
        return Path(read_pool(pool).path)
    logs = endpoint.log_paths()
    if not logs:
        raise SpecError(f"endpoint {endpoint.name!r} lists no workload logs; pass --pool")
    return Path(build_pool(logs, endpoint.name, Path(out_dir) / "pool").pool_path)
