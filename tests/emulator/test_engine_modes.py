"""EmulatorEngine: the HTTP mode serves real streaming responses the runner measures; the grid search."""
from __future__ import annotations

import json

from autoresearch_dagster.experiments.grid import GridSettings, grid_points, run_grid, write_grid
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.loadgen.records import ScheduledRequest
from autoresearch_dagster.pool.schema import write_pool

from .helpers import endpoint, pool


def test_http_mode_streams_through_the_runner():
    ep = endpoint()
    body = {"model": ep.model, "prompt": "hello world " * 100, "max_tokens": 20, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    dep = EmulatorEngine(ep, mode="http", noise=NoiseSettings.off()).deploy({"stream_interval": 2}, seed=0)
    try:
        assert dep.base_url.startswith("http://127.0.0.1:")
        sched = [ScheduledRequest(f"h{i}", i * 0.05, "completions", dict(body), 200, 20, [], 64) for i in range(3)]
        out = dep.run_step(sched, step_id="h", timeout_s=30)
        assert [r.status for r in out.records] == ["ok"] * 3
        assert all(r.output_tokens == 20 and r.ttft_s > 0 and len(r.itl_s) == 10 for r in out.records)
        info = dep.server_info()
        assert info["version"].startswith("emulator-") and info["stream_interval"] == 2
    finally:
        dep.close()


def test_grid_measures_default_and_every_point(tmp_path):
    ep = endpoint(sla="ttft_p99<=3000ms,tpot_p99<=40ms")
    pool_path = write_pool(pool(n=300, prompt_median=1500, output_median=120, seed=13).requests, tmp_path / "pool")
    grid = {"quantization": (None, "fp8")}
    assert grid_points(grid) == [{}, {"quantization": "fp8"}]
    res = run_grid(ep, pool_path, grid=grid, settings=GridSettings(step_duration_s=30, min_completed=60, workers=1))
    assert res.default["config"] == {} and len(res.points) == 2
    assert res.best["config"] == {"quantization": "fp8"} and res.best["lossy"]
    assert res.best_lossless["config"] == {}
    assert res.ratio > 1.1
    data = json.loads(write_grid(res, tmp_path / "out").read_text())
    assert set(data) >= {"default", "best", "points"} and data["best"]["capacity_rps"] == res.best["capacity_rps"]
