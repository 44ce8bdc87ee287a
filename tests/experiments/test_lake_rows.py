"""Lake rows come from the typed results (one method each), and the lake answers which candidates were tested."""
from __future__ import annotations

import json
from datetime import datetime, timedelta

from autoresearch_dagster.experiments import stats
from autoresearch_dagster.experiments.campaign import start_campaign
from autoresearch_dagster.experiments.experiment import run_experiment, already_tested
from autoresearch_dagster.experiments.noise import measure_noise
from autoresearch_dagster.experiments.runs import HarnessSettings
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.results import TABLES, open_lake
from autoresearch_dagster.spec import Budget, EndpointSpec, config_hash

from .helpers import FakeEngine, make_pool

FAST = HarnessSettings(capacity=CapacitySettings(step_duration_s=6, min_completed=5, warmup_s=0, resolution=0.01,
                                                 start_rps=1.0), warmup_requests=4, confirm=False)


def _endpoint():
    return EndpointSpec(name="demo", model="m", hardware={"gpu": "H200", "count": 1},
                        sla="ttft_p99<=1000ms,errors<=1%", server_config={"schedule_policy": "fcfs"})


def _columns_declared(rows: dict[str, list[dict]]) -> None:
    for table, table_rows in rows.items():
        assert table_rows and set(table_rows[0]) <= set(TABLES[table].names), table


def test_each_result_gives_its_rows_and_the_lake_stores_them(tmp_path):
    endpoint, pool, lake = _endpoint(), make_pool(tmp_path / "pool"), open_lake(tmp_path / "lake")
    eng = FakeEngine(lambda c: 12.0 if c.get("schedule_policy") == "lpm" else 10.0, noise_cv=0.01)
    camp = start_campaign(endpoint, pool, results=lake, engine_name="fake")
    _columns_declared(camp.lake_rows(endpoint))
    noise = measure_noise(endpoint, endpoint.server_config, pool, engine=eng, runs=5, results=lake, settings=FAST,
                          campaign=camp)
    _columns_declared(noise.lake_rows())
    assert list(noise.to_dict()["comparison_noise_floor"]) == [str(n) for n in stats.run_schedule()]
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         results=lake, settings=FAST, budget=Budget(initial_runs_per_arm=2, max_runs_per_arm=2),
                         noise_cv=noise.capacity_cv, campaign=camp)
    _columns_declared(res.lake_rows())
    _columns_declared(res.runs[0].lake_rows(experiment_id=res.experiment_id, campaign_id=camp.campaign_id, gpus=1))
    row = lake.read("experiments", endpoint="demo")[0]
    assert {k: row[k] for k in ("experiment_id", "verdict", "baseline_hash", "candidate_hash")} == {
        "experiment_id": res.experiment_id, "verdict": res.verdict, "baseline_hash": res.baseline_hash,
        "candidate_hash": res.candidate_hash}
    assert len(lake.read("verdicts", endpoint="demo")) == len(res.stages)
    assert len(lake.read("noise", endpoint="demo")) == 1
    assert {r["reason"] for r in lake.read("baselines", endpoint="demo")} == {"original"}

    # the one verdict summary CLI and assets report: the result without its per-run details
    summary = res.summary()
    assert "runs" not in summary and summary == {k: v for k, v in res.to_dict().items() if k != "runs"}
    assert summary["estimator"] == FAST.estimator
    json.dumps(summary)

    # which candidates were tested against a baseline is a query over the lake's experiments table
    assert already_tested(lake, "demo", config_hash(endpoint.server_config)) == {res.candidate_hash}
    assert already_tested(lake, "demo", res.candidate_hash) == set()
    # a baseline set after the experiment (a re-seed, a promotion) starts its rounds afresh
    started = datetime.fromisoformat(res.started_at)
    base = config_hash(endpoint.server_config)
    assert already_tested(lake, "demo", base, since=started) == {res.candidate_hash}
    assert already_tested(lake, "demo", base, since=started + timedelta(seconds=1)) == set()
