"""Where the run-to-run spread of a capacity measurement comes from, on the demo endpoint.

Each row measures ``--runs`` capacities of the default config with the harness's own ``find_capacity``
(RUNNER's protocol: 40 s steps, 1% resolution, the interpolated SLA crossing), one fresh deployment per
run, and prints their CV. The rows change one thing each:

- ``all``: deployment seed and workload seed both vary (what repeated baseline runs do);
- ``workload fixed``: one workload seed (arrivals, requests) for every run, the engine's noise varies;
- ``engine seed fixed``: one deployment seed, the workload varies;
- ``noise off``: the emulator's noise off (``NoiseSettings.off``), the workload varies;
- ``clock only`` / ``jitter only`` / ``throttling only``: one of the three noise components alone.

Read with ``emulator/noise.py``: a per-deployment clock factor is the one component more runs per arm
cannot average inside a run, and the capacity search amplifies it by the capacity's elasticity to
iteration speed at the SLA (``bench_verdicts.py`` prints that elasticity as its faster/slower banks'
true ratios).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoresearch_dagster.emulator.noise import NoiseSettings  # noqa: E402
from autoresearch_dagster.engines.emulator import EmulatorEngine  # noqa: E402
from autoresearch_dagster.measure import capacity as measure  # noqa: E402
from autoresearch_dagster.measure.profiles import CapacitySettings  # noqa: E402
from autoresearch_dagster.pool.build import build_pool  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.spec import load_endpoint  # noqa: E402

_D = NoiseSettings()
ROWS = {  # name: (noise settings, vary the deployment seed, vary the workload seed)
    "all": (_D, True, True),
    "workload fixed": (_D, True, False),
    "engine seed fixed": (_D, False, True),
    "noise off": (NoiseSettings.off(), True, True),
    "clock only": (NoiseSettings(clock_cv=_D.clock_cv, step_jitter_cv=0.0, throttle_rate_per_s=0.0), True, True),
    "jitter only": (NoiseSettings(clock_cv=0.0, step_jitter_cv=_D.step_jitter_cv, throttle_rate_per_s=0.0), True, True),
    "throttling only": (NoiseSettings(clock_cv=0.0, step_jitter_cv=0.0), True, True),
}
_W: dict = {}


def _init(endpoint: str, pool_path: str, settings: CapacitySettings) -> None:
    _W.update(endpoint=load_endpoint(endpoint), pool=read_pool(pool_path), settings=settings)


def _measure(task: tuple[str, int]) -> tuple[str, float | None]:
    row, i = task
    noise, vary_engine, vary_workload = ROWS[row]
    ep = _W["endpoint"]
    dep = EmulatorEngine(ep, noise=noise).deploy(ep.server_config, seed=5_000 + i if vary_engine else 77)
    try:
        dep.flush_cache()
        cap = measure.find_capacity(dep, _W["pool"], ep.sla, gpus=ep.gpus, model=ep.model, settings=_W["settings"],
                                    seed=9_000 + i if vary_workload else 31)
    finally:
        dep.close()
    return row, (cap.capacity_interp_rps or cap.capacity_rps) if cap.valid else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default=str(ROOT / "examples/endpoints/demo.yaml"))
    ap.add_argument("--runs", type=int, default=60, help="runs per row")
    ap.add_argument("--step-duration", type=float, default=40.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    t0 = time.monotonic()
    ep = load_endpoint(args.endpoint)
    settings = CapacitySettings(step_duration_s=args.step_duration, min_completed=60, warmup_s=0.0, resolution=0.01,
                                start_rps=16.0)
    with tempfile.TemporaryDirectory() as tmp:
        pool_path = str(build_pool(ep.log_paths(), ep.name, Path(tmp) / "pool").pool_path)
        tasks = [(row, i) for row in ROWS for i in range(args.runs)]
        print(f"{len(tasks)} runs ({args.runs} per row, {args.step_duration:g} s steps) on {args.workers} workers",
              flush=True)
        with mp.get_context("fork").Pool(args.workers, initializer=_init,
                                          initargs=(args.endpoint, pool_path, settings)) as p:
            out = p.map(_measure, tasks, chunksize=4)
    print(f"{'row':20s} {'valid':>5s} {'median req/s':>12s} {'CV':>7s}")
    for row in ROWS:
        v = np.array([c for r, c in out if r == row and c])
        cv = v.std(ddof=1) / v.mean() if len(v) > 1 else float("nan")
        print(f"{row:20s} {len(v):5d} {np.median(v):12.3f} {cv:7.2%}")
    print(f"noise settings: {_D}; wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
