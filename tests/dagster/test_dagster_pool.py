"""replay_pool + its blocking fidelity check, materialized for real (SQLite here, PostgreSQL below)."""
import json
import os

import dagster as dg
import pytest

from jobs.instance import execute
from jobs.instance import instance as project_instance
from .conftest import make_defs

POOL = dg.AssetKey("replay_pool")
FIDELITY = dg.AssetCheckKey(POOL, "replay_fidelity")


def materialize_pool(defs, instance, partition, raise_on_error=True):
    instance.add_dynamic_partitions("endpoints", [partition])
    return execute(defs, instance, partition, [POOL], raise_on_error=raise_on_error)


def check_result(result) -> dg.AssetCheckEvaluation:
    (evaluation,) = [e.event_specific_data for e in result.all_events
                     if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION]
    return evaluation


def test_replay_pool_materializes_with_metadata_and_passing_fidelity(project, instance):
    result = materialize_pool(make_defs(project), instance, "ep1")
    assert result.success
    (mat,) = result.asset_materializations_for_node("replay_pool")
    md = mat.metadata
    assert md["dagster/row_count"].value == md["rows_in"].value - md["rows_quarantined"].value > 1000
    columns = {c.name for c in md["dagster/column_schema"].schema.columns}
    assert {"arrival_s", "prompt_tokens", "block_hashes", "split"} <= columns
    assert os.path.exists(md["path"].value)
    evaluation = check_result(result)
    assert evaluation.passed, evaluation.description


def test_unfaithful_pool_fails_the_blocking_check_and_names_the_statistic(project, instance):
    defs = make_defs(project)
    assert materialize_pool(defs, instance, "ep1").success
    # corrupt the fidelity report as an unfaithful build would write it, then re-run only the check
    path = project / "out" / "lake" / "_pools" / "ep1" / "fidelity.json"
    report = json.loads(path.read_text())
    name = next(iter(report["checks"]))
    report["checks"][name]["passed"] = False
    report["passed"] = False
    path.write_text(json.dumps(report))
    result = execute(defs, instance, "ep1", [], checks=[FIDELITY], raise_on_error=False)
    assert not result.success  # a failed blocking check fails its run
    evaluation = check_result(result)
    assert not evaluation.passed and name in evaluation.description
    assert evaluation.metadata["n_failed"].value == 1


@pytest.mark.postgres
def test_replay_pool_on_a_real_postgres_instance(project, tmp_path, monkeypatch):
    """scripts/test.sh starts a throwaway PostgreSQL (scripts/pg.sh) and exports DAGSTER_PG_*."""
    if not os.environ.get("DAGSTER_PG_HOST"):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DAGSTER_PG_* not set in CI: scripts/test.sh must start PostgreSQL (scripts/pg.sh)")
        pytest.skip("no PostgreSQL server: run through scripts/test.sh")
    # a fresh database per test run, so the assertions below see only this run
    import psycopg2

    db = f"t_{os.getpid()}"
    conn = psycopg2.connect(host=os.environ["DAGSTER_PG_HOST"], port=os.environ["DAGSTER_PG_PORT"],
                            user=os.environ["DAGSTER_PG_USERNAME"], dbname=os.environ["DAGSTER_PG_DB"])
    conn.autocommit = True
    conn.cursor().execute(f"CREATE DATABASE {db}")
    monkeypatch.setenv("DAGSTER_PG_DB", db)
    try:
        instance = project_instance(tmp_path / "home", storage="postgres")
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result = materialize_pool(make_defs(project), instance, "ep1")
        assert result.success and check_result(result).passed
        rec = instance.get_latest_materialization_event(POOL)
        assert rec.asset_materialization.partition == "ep1"
        with psycopg2.connect(host=os.environ["DAGSTER_PG_HOST"], port=os.environ["DAGSTER_PG_PORT"],
                              user=os.environ["DAGSTER_PG_USERNAME"], dbname=db) as c2:
            cur = c2.cursor()
            cur.execute("SELECT count(*) FROM runs WHERE status = 'SUCCESS'")
            assert cur.fetchone()[0] == 1
        instance.dispose()
    finally:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        conn.close()
