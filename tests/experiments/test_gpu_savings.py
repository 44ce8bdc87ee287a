"""GPUs saved under the real demand curve: the comparison of two arms' demand replays, an autoscaled endpoint's runs
and experiments through the harness (lake rows linked to run, experiment and arm), the production replay's
autoscaling report, and the per-GPU capacity of an autoscaled fleet."""
import json

import numpy as np
import pytest

from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.experiments import gpu_savings
from autoresearch_dagster.experiments.experiment import run_experiment
from autoresearch_dagster.experiments.runs import HarnessSettings, execute_run
from autoresearch_dagster.measure.autoscaling import mean_gpus_held
from autoresearch_dagster.measure.capacity import find_capacity
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.measure.shape import run_shape
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import Budget, EndpointSpec

from ..loadgen.helpers import burst_pool

AUTO = {"min_replicas": 1, "max_replicas": 6, "metric": "in_flight", "target": 24, "decision_interval_s": 5,
        "cold_start_s": 10, "scale_down_cooldown_s": 20}
# a replica admitting 12 requests at a time queues under the burst and scales out further than an uncapped one
CAPPED, UNCAPPED = {"max_running_requests": 12}, {}
QUICK = CapacitySettings(step_duration_s=10.0, min_completed=20, start_rps=6.0, max_steps=9, resolution=0.3,
                         warmup_s=0.0)


def _report(gpu_seconds: float, window_s: float = 100.0, **kw) -> dict:
    return {"gpu_seconds": gpu_seconds, "window_s": window_s, "burst_requests": 10, "burst_sla_misses": 2,
            "scale_up_latency_median_s": 12.0, **kw}




def _endpoint(count: int = 1, **auto) -> EndpointSpec:
    return EndpointSpec.model_validate({"name": "auto", "model": "gemma-moe-26b-a4b",
                                        "hardware": {"gpu": "H200", "count": count}, "sla": "ttft_p99<=1000ms",
                                        "server_config": CAPPED, "autoscaling": {**AUTO, **auto}})


def test_savings_compares_median_gpu_seconds_with_an_interval_and_mean_gpus():
    base = [_report(g) for g in (400.0, 420.0, 410.0, 390.0)]
    cand = [_report(g) for g in (300.0, 310.0, 305.0, 320.0)]
    s = gpu_savings.savings(base, cand, seed=1)
    assert s["gpu_seconds_ratio"] == pytest.approx(np.median([300, 310, 305, 320]) / np.median([400, 420, 410, 390]))
    assert s["ci_low"] <= s["gpu_seconds_ratio"] <= s["ci_high"] < 1.0 and s["confidence"] == 0.9
    assert s["mean_gpus_baseline"] == pytest.approx(4.05) and s["mean_gpus_candidate"] == pytest.approx(3.0875)
    assert s["mean_gpus_saved"] == pytest.approx(4.05 - 3.0875)
    assert s["burst_miss_rate_baseline"] == pytest.approx(0.2) and s["runs_baseline"] == 4
    one = gpu_savings.savings(base[:1], cand[:1])  # one run an arm: the ratio, no interval
    assert one["gpu_seconds_ratio"] == pytest.approx(0.75) and one["ci_low"] is None
    assert "no interval" in gpu_savings.format_line(one) and "0.75" in gpu_savings.format_line(one)
    assert gpu_savings.savings(base, [None]) is None and gpu_savings.savings([], cand) is None


def test_mean_gpus_held_is_the_gpu_seconds_weighted_mean():
    ts = [{"t": 0.0, "replicas": 1.0}, {"t": 10.0, "replicas": 3.0}, {"t": 30.0, "replicas": 2.0}]
    assert mean_gpus_held(ts, window_s=40.0, gpus_per_replica=2) == pytest.approx(2 * (10 + 60 + 20) / 40)
    assert mean_gpus_held([{"t": 0.0, "num_running": 3}], window_s=40.0, gpus_per_replica=2) is None


def test_capacity_per_gpu_of_an_autoscaled_fleet_divides_by_the_gpus_it_held():
    pool = burst_pool()
    fleet = _endpoint(count=2, target=8)
    dep = EmulatorEngine(fleet, noise=NoiseSettings.off()).deploy({})
    res = find_capacity(dep, pool, fleet.sla, gpus=fleet.gpus, model=fleet.model, settings=QUICK)
    assert res.capacity_rps > 0
    # the fleet scaled out during the step at capacity: more GPUs than one replica's, at most the maximum
    assert fleet.gpus < res.gpus_held <= 6 * fleet.gpus
    assert res.capacity_rps_per_gpu == pytest.approx(res.capacity_rps / res.gpus_held)
    assert res.to_dict()["gpus_held"] == res.gpus_held
    single = fleet.model_copy(update={"autoscaling": None})
    one = find_capacity(EmulatorEngine(single, noise=NoiseSettings.off()).deploy({}), pool, single.sla,
                        gpus=single.gpus, model=single.model, settings=QUICK)
    assert one.gpus_held == 2.0 and one.capacity_rps_per_gpu == pytest.approx(one.capacity_rps / 2)


def test_shape_search_keeps_the_demand_replay_beside_the_replay_capacity():
    ep = _endpoint()
    dep = EmulatorEngine(ep, noise=NoiseSettings.off()).deploy({})
    res = run_shape(dep, burst_pool(rate=6.0), ep.sla, gpus=1, model=ep.model, search=True, interval_s=10.0,
                    max_steps=8, resolution=0.5)
    assert res.valid and res.demand_speedup == 1.0 and res.demand_autoscaling is not None
    assert res.steps[0].rate_rps == 1.0  # the search's first replay is the demand as logged
    # the search doubled the speed, missed the SLA, and settled between: 1.5x under cost model 7 (2.0x under 6)
    assert [s.rate_rps for s in res.steps[:2]] == [1.0, 2.0] and not res.steps[1].meets_sla
    assert res.speedup == res.replay_capacity and 1.0 < res.speedup < 2.0
    # the capacity run is the sped-up replay: a shorter window (1/speedup of it, plus the drain), other GPU-seconds
    assert res.autoscaling["window_s"] < (1 / res.speedup + 0.05) * res.demand_autoscaling["window_s"]
    assert res.to_dict()["demand_autoscaling"]["gpu_seconds"] == res.demand_autoscaling["gpu_seconds"]


def test_an_autoscaled_run_replays_the_demand_and_links_its_lake_rows(tmp_path):
    ep = _endpoint()
    pool = burst_pool()
    eng = EmulatorEngine(ep, noise=NoiseSettings.off())
    settings = HarnessSettings(capacity=QUICK, warmup_requests=2, shape_interval_s=10.0)
    rec = execute_run(ep, CAPPED, pool, engine=eng, arm="candidate", run_index=0, seed=1, purpose="experiment",
                      settings=settings, mode="capacity")
    assert rec.valid, rec.invalid_reasons
    assert rec.capacity_rps > 0 and rec.gpus_held >= 1 and rec.demand_speedup == 1.0
    assert rec.autoscaling["gpu_seconds"] > 0 and rec.autoscaling["replicas_max"] > 1
    rows = rec.lake_rows(experiment_id="e-1", campaign_id="c-1", gpus=1)
    (row,) = rows["autoscaling"]
    assert (row["run_id"], row["experiment_id"], row["campaign_id"], row["role"], row["replay"]) == (
        rec.run_id, "e-1", "c-1", "candidate", "demand")
    assert rows["runs"][0]["gpus_held"] == rec.gpus_held
    lake = open_lake(tmp_path / "lake")
    lake.append_rows(rows, endpoint="auto")
    (got,) = lake.query("SELECT a.gpu_seconds, r.arm FROM autoscaling a JOIN runs r USING (run_id)")
    assert got == (pytest.approx(rec.autoscaling["gpu_seconds"]), "candidate")
    # a noise run measures capacity only; mode demand measures only the demand replay; the setting turns it off
    noise = execute_run(ep, CAPPED, pool, engine=eng, arm="baseline", run_index=1, seed=2, purpose="noise",
                        settings=settings, mode="capacity")
    assert noise.autoscaling is None and "autoscaling" not in noise.lake_rows(experiment_id=None, campaign_id=None,
                                                                             gpus=1)
    demand = execute_run(ep, CAPPED, pool, engine=eng, arm="baseline", run_index=2, seed=3, purpose="gpu_savings",
                         settings=settings, mode="demand")
    assert demand.capacity_rps is None and demand.autoscaling["gpu_seconds"] > 0
    off = execute_run(ep, CAPPED, pool, engine=eng, arm="baseline", run_index=3, seed=4, purpose="experiment",
                      settings=HarnessSettings(capacity=QUICK, warmup_requests=2, demand_replay=False), mode="capacity")
    assert off.autoscaling is None and off.capacity_rps > 0


def test_an_experiment_on_an_autoscaled_endpoint_reports_gpus_saved(tmp_path):
    ep = _endpoint()
    lake = open_lake(tmp_path / "lake")
    res = run_experiment(ep, CAPPED, UNCAPPED, burst_pool(), engine=EmulatorEngine(ep), results=lake,
                         settings=HarnessSettings(capacity=QUICK, warmup_requests=2, shape_interval_s=10.0,
                                                  confirm=False, mode="capacity"),
                         budget=Budget(initial_runs_per_arm=2, max_runs_per_arm=2), noise_cv=0.05)
    g = res.gpu_savings
    assert g is not None and g["runs_baseline"] == g["runs_candidate"] == 2
    assert g["gpu_seconds_ratio"] < 0.95 and g["mean_gpus_saved"] > 0.1  # the uncapped replicas serve more each
    assert g["ci_low"] <= g["gpu_seconds_ratio"] <= g["ci_high"] and g["demand_speedup"] == 1.0
    assert res.summary()["gpu_savings"] == g
    (row,) = lake.query("SELECT demand_gpu_seconds_ratio, demand_gpu_seconds_ratio_ci_low, demand_mean_gpus_saved "
                        "FROM experiments")
    assert row == (pytest.approx(g["gpu_seconds_ratio"]), pytest.approx(g["ci_low"]), pytest.approx(g["mean_gpus_saved"]))
    rows = lake.query("SELECT run_id, role, replay FROM autoscaling WHERE experiment_id = ? ORDER BY role",
                      [res.experiment_id])
    assert sorted({r[1] for r in rows}) == ["baseline", "candidate"] and {r[2] for r in rows} == {"demand"}
    assert {r[0] for r in rows} == {r.run_id for r in res.runs}


def test_measure_savings_replays_both_configs_and_needs_an_autoscaled_endpoint(tmp_path):
    ep = _endpoint()
    lake = open_lake(tmp_path / "lake")
    lines: list[str] = []
    s = gpu_savings.measure_savings(ep, CAPPED, UNCAPPED, burst_pool(), engine=EmulatorEngine(ep), runs=2,
                                    settings=HarnessSettings(warmup_requests=0, shape_interval_s=10.0,
                                                             capacity=QUICK),
                                    results=lake, campaign_id="c-9", progress=lines.append)
    assert s["runs_baseline"] == s["runs_candidate"] == 2 and s["gpu_seconds_ratio"] < 0.95
    assert s["mean_gpus_saved"] > 0.1 and s["ci_low"] is not None and len(lines) == 4
    assert lake.query("SELECT count(*), min(campaign_id) FROM runs WHERE purpose = 'gpu_savings'") == [(4, "c-9")]
    assert json.loads(json.dumps(s))  # plain data (campaign.json, the review package)
    single = ep.model_copy(update={"autoscaling": None})
    assert gpu_savings.measure_savings(single, CAPPED, UNCAPPED, burst_pool(), engine=EmulatorEngine(single),
                                       runs=2) is None
