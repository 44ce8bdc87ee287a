"""The emulator's exhaustive grid: derived from the knob table, measured point by point."""
from __future__ import annotations

import json

from autoresearch_dagster.emulator.workloads import WorkloadShape, synthetic_pool
from autoresearch_dagster.experiments.grid import (DEFAULT_GRID, QUICK_GRID, GridSettings, grid_points, grid_size,
                                                   knob_grid, run_grid, write_grid)
from autoresearch_dagster.pool.schema import write_pool
from autoresearch_dagster.spec import KNOBS, EndpointSpec


def test_the_grids_are_the_knob_tables_search_values():
    # the grids once hard-coded values that differed from spec.KNOBS; now the table is their one source
    assert all(values == KNOBS[name].search_values for name, values in DEFAULT_GRID.items())
    assert all(set(values) <= set(DEFAULT_GRID[name]) for name, values in QUICK_GRID.items())
    assert QUICK_GRID["prefill_decode_interval"] == (0, 4)  # first and middle of (0, 2, 4, 8, 16)
    assert knob_grid(["enable_mixed_chunk", "quantization"], quick=True) == {
        "enable_mixed_chunk": (False, True), "quantization": (None, "fp8")}
    assert (grid_size(DEFAULT_GRID), grid_size(QUICK_GRID)) == (320, 32)


def test_grid_measures_default_and_every_point(tmp_path):
    ep = EndpointSpec(name="t", model="gemma-moe-26b-a4b", hardware={"gpu": "H200"}, sla="ttft_p99<=3000ms,tpot_p99<=40ms")
    pool_path = write_pool(synthetic_pool(WorkloadShape(n=300, prompt_median=1500, output_median=120), seed=13).requests, tmp_path / "pool")
    grid = {"quantization": (None, "fp8")}
    assert grid_points(grid) == [{}, {"quantization": "fp8"}]
    res = run_grid(ep, pool_path, grid=grid, settings=GridSettings(step_duration_s=30, min_completed=60, workers=1))
    assert res.default["config"] == {} and len(res.points) == 2
    assert res.best["config"] == {"quantization": "fp8"} and res.best["lossy"]
    assert res.best_lossless["config"] == {}
    assert res.ratio > 1.1
    data = json.loads(write_grid(res, tmp_path / "out").read_text())
    assert set(data) >= {"default", "best", "points"} and data["best"]["capacity_rps"] == res.best["capacity_rps"]
