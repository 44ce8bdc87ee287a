"""The example autoscaled endpoint (examples/endpoints/demo-autoscaled.yaml) through the CLI: `replay shape` on the
first minutes of the demo logs reports its fleet, a candidate's GPUs saved, the plot and the lake rows; `replay
capacity` divides its capacity by the GPUs the fleet held."""
import json

import pytest

from autoresearch_dagster.cli import main
from autoresearch_dagster.pool.sources import ensure_pool
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import load_endpoint

from ..dagster.conftest import ROOT

SPEC = ROOT / "examples/endpoints/demo-autoscaled.yaml"
LINES = 300  # the demo's first minutes


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("example")
    logs = tmp / "chat.jsonl"
    logs.write_text("".join((ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines(keepends=True)[:LINES]))
    # a fixed redaction key: without one every build redacts under a fresh random key, and the fleet's replica
    # decisions (discrete, at thresholds) moved the candidate's GPU-seconds ratio between 0.76 and 1.00 at 2x demand
    return ensure_pool([logs], "demo-autoscaled", tmp / "pool", fmt="auto", say=lambda _m: None,
                       key=b"test-autoscaled-example").home


def test_the_example_spec_is_the_demo_behind_an_autoscaler():
    spec, demo = load_endpoint(SPEC), load_endpoint(ROOT / "examples/endpoints/demo.yaml")
    assert spec.autoscaling is not None and spec.autoscaling.max_replicas > spec.autoscaling.min_replicas
    assert (spec.model, spec.hardware, spec.sla, spec.workload.logs) == (demo.model, demo.hardware, demo.sla,
                                                                         demo.workload.logs)


def test_replay_shape_on_the_example_reports_the_fleet_and_the_gpus_a_candidate_saves(pool, tmp_path, capsys):
    out, lake = tmp_path / "shape", tmp_path / "lake"
    rc = main(["replay", "shape", "--pool", str(pool), "--engine", "emulator", "--endpoint", str(SPEC),
               "--speedup", "3", "--out", str(out), "--lake", str(lake),  # 3x the demo's light demand: it scales
               "--candidate", str(ROOT / "examples/candidates/demo_better_fp8.yaml")])
    printed = capsys.readouterr().out
    assert rc == 0 and "autoscaling: " in printed and "GPUs saved on average" in printed
    summary = json.loads((out / "summary.json").read_text())
    a, c = summary["autoscaling"], summary["autoscaling_comparison"]
    assert a["gpus_per_replica"] == 1 and 1 < a["mean_replicas"] <= 4 and a["scale_ups"]
    assert all(u["cold_start_s"] == pytest.approx(30.0) for u in a["scale_ups"])  # the spec's cold start
    assert c["gpu_seconds_ratio"] < 1.0  # fp8 weights and KV: shorter requests, fewer in flight per replica
    assert (out / "autoscaling.png").stat().st_size > 10_000
    assert open_lake(lake).query("SELECT count(*) FROM autoscaling WHERE endpoint = 'demo-autoscaled'") == [(2,)]


def test_replay_capacity_on_the_example_is_per_gpu_held(pool, tmp_path, capsys):
    rc = main(["replay", "capacity", "--pool", str(pool), "--engine", "emulator", "--endpoint", str(SPEC),
               "--step-duration", "20", "--min-completed", "40", "--start-rps", "8", "--resolution", "0.2",
               "--out", str(tmp_path / "cap")])
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "cap" / "summary.json").read_text())
    assert rc in (0, 1) and summary["capacity_rps"] > 0
    assert summary["gpus_held"] > 1 and "GPUs held" in printed  # the fleet scaled out to serve it
    assert summary["capacity_rps_per_gpu"] == pytest.approx(summary["capacity_rps"] / summary["gpus_held"])
