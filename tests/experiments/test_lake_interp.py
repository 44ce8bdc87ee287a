"""The runs table's interpolated capacity: written from each RunRecord, in capacity_by_config; old lakes still read."""
from __future__ import annotations

import statistics

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autoresearch_dagster.experiments.campaign import start_campaign
from autoresearch_dagster.experiments.noise import measure_noise
from autoresearch_dagster.experiments.runs import HarnessSettings
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.results import DB_NAME, SCHEMA_PARTITION, TABLES, ResultsLake, open_lake
from autoresearch_dagster.spec import EndpointSpec

from .helpers import FakeEngine, make_pool

FAST = CapacitySettings(step_duration_s=6, min_completed=5, warmup_s=0, resolution=0.01, start_rps=1.0)


def test_runs_record_interp_capacity_and_capacity_by_config_exposes_it(tmp_path):
    endpoint = EndpointSpec(name="demo", model="m", hardware={"gpu": "H200", "count": 2},
                            sla="ttft_p99<=1000ms,errors<=1%", server_config={})
    pool = make_pool(tmp_path)
    lake = open_lake(tmp_path / "lake")
    camp = start_campaign(endpoint, pool, results=lake)
    res = measure_noise(endpoint, {}, pool, engine=FakeEngine(lambda c: 10.0, noise_cv=0.03), runs=5, results=lake,
                        settings=HarnessSettings(capacity=FAST, warmup_requests=4), campaign=camp)
    interp = {r.run_id: r.capacity_interp_rps for r in res.runs}
    assert sum(v is not None for v in interp.values()) >= 4  # the fake has a sharp SLA crossing to interpolate
    rows = dict(lake.query("SELECT run_id, capacity_interp_rps FROM runs"))
    assert rows == pytest.approx(interp)
    # interp differs from the search capacity (the search reports a passing rate below the crossing)
    assert any(r.capacity_interp_rps != r.capacity_rps for r in res.runs if r.capacity_interp_rps is not None)

    (runs, n_interp, med, med_gpu, med_search), = lake.query(
        "SELECT runs, runs_interp, capacity_interp_rps_median, capacity_interp_rps_per_gpu_median, "
        "capacity_rps_median FROM capacity_by_config")
    values = [r.value("capacity_interp_rps") for r in res.runs if r.valid]
    assert runs == len(values) and n_interp == sum(r.capacity_interp_rps is not None for r in res.runs if r.valid)
    assert med == pytest.approx(statistics.median(values)) and med_gpu == pytest.approx(med / 2)
    assert med == pytest.approx(statistics.median(res.capacities))  # the noise floor's default statistic
    assert med_search == pytest.approx(statistics.median(r.capacity_rps for r in res.runs if r.valid))


def test_a_lake_written_before_the_column_still_reads_and_gets_it(tmp_path):
    root = tmp_path / "lake"
    open_lake(root)
    old = pa.schema([f for f in TABLES["runs"] if f.name != "capacity_interp_rps"])
    pq.write_table(old.empty_table(), root / "runs" / f"endpoint={SCHEMA_PARTITION}" / "part-schema.parquet")
    (root / "runs" / "endpoint=demo").mkdir()
    pq.write_table(pa.Table.from_pylist([{"run_id": "old", "config_hash": "h", "capacity_rps": 8.0, "gpus": 1,
                                          "valid": True}], schema=old),
                   root / "runs" / "endpoint=demo" / "part-old.parquet")
    (root / DB_NAME).unlink()
    con = duckdb.connect(str(root / DB_NAME))  # the analytics file as the old code left it: no interp anywhere
    con.execute(next(s for s in ResultsLake(root).view_sql() if s.startswith("CREATE OR REPLACE VIEW runs ")))
    con.execute("CREATE VIEW capacity_by_config AS SELECT config_hash, median(capacity_rps) AS capacity_rps_median "
                "FROM runs WHERE valid GROUP BY ALL")
    assert "capacity_interp_rps" not in [d[0] for d in con.execute("SELECT * FROM runs").description]
    con.close()

    lake = ResultsLake(root)  # a new process opening the old lake
    assert lake.query("SELECT run_id, capacity_interp_rps FROM runs") == [("old", None)]
    assert lake.query("SELECT capacity_interp_rps_median, runs_interp FROM capacity_by_config") == [(8.0, 0)]
    lake.append("runs", [{"run_id": "new", "config_hash": "h", "capacity_rps": 9.0, "capacity_interp_rps": 9.5,
                          "gpus": 1, "valid": True}], endpoint="demo")
    assert lake.query("SELECT run_id, capacity_interp_rps FROM runs ORDER BY run_id") == [("new", 9.5), ("old", None)]
    assert lake.query("SELECT capacity_interp_rps_median, runs_interp FROM capacity_by_config") == [(8.75, 1)]
    types = dict(lake.query("SELECT column_name, data_type FROM information_schema.columns "
                            "WHERE table_name='runs'"))
    assert types["capacity_interp_rps"] == "DOUBLE"
