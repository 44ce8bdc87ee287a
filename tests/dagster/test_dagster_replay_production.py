"""The blocking replay_vs_production check on noise_baseline, executed for real: the production config
replays the pool at production speed and is compared with what the log says production did. A faithful
pool passes; deliberately unfaithful ones fail, naming the property that drifted."""
import json
import shutil

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autoresearch_dagster.results import ResultsLake
from jobs.instance import execute
from .conftest import ROOT, make_defs, write_spec

POOL = dg.AssetKey("replay_pool")
CHECK = dg.AssetCheckKey(dg.AssetKey("noise_baseline"), "replay_vs_production")
LINES = 600  # about five minutes of the demo's traffic: a short replay


@pytest.fixture
def small_project(tmp_path):
    """Endpoint 'ep1' over the first minutes of the demo log."""
    logs = tmp_path / "logs"
    logs.mkdir()
    head = (ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines(keepends=True)[:LINES]
    (logs / "chat.jsonl").write_text("".join(head))
    (tmp_path / "endpoints").mkdir()
    write_spec(tmp_path / "endpoints", "ep1", [logs / "chat.jsonl"])
    (tmp_path / "candidates").mkdir()
    return tmp_path


def check_evaluation(result) -> dg.AssetCheckEvaluation:
    (evaluation,) = [e.event_specific_data for e in result.all_events
                     if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
                     and e.event_specific_data.check_name == CHECK.name]
    return evaluation


def build_pool_and_check(project, instance, corrupt=None):
    defs = make_defs(project)
    instance.add_dynamic_partitions("endpoints", ["ep1"])
    assert execute(defs, instance, "ep1", [POOL]).success
    home = project / "out" / "lake" / "_pools" / "ep1"
    if corrupt:
        path = home / "replay_pool.parquet"
        table = pq.read_table(path)
        meta = pq.read_metadata(path).metadata
        pq.write_table(corrupt(table).replace_schema_metadata(meta), path)
    return execute(defs, instance, "ep1", [], checks=[CHECK], raise_on_error=False)


def test_a_faithful_pool_passes_and_the_report_reaches_the_store_and_the_lake(small_project, instance):
    result = build_pool_and_check(small_project, instance)
    evaluation = check_evaluation(result)
    assert result.success and evaluation.passed, evaluation.description
    md = evaluation.metadata
    assert md["n_failed"].value == 0 and "cached_token_ratio" in md["report"].value
    report = json.loads((small_project / "out" / "ep1" / "noise_baseline" / "production_replay.json").read_text())
    ratio = next(c for c in report["checks"] if c["name"] == "cached_token_ratio")
    assert ratio["production"] > 0.3 and not ratio.get("skipped")  # the demo log carries production's cached tokens
    assert (small_project / "out" / "ep1" / "noise_baseline" / "production_replay_records.parquet").exists()
    lake = ResultsLake(small_project / "out" / "lake")
    rows = lake.query("SELECT property, passed FROM production_fidelity WHERE endpoint = 'ep1'")
    assert len(rows) == len(report["checks"]) and all(passed for _, passed in rows)


def _rekeyed_prefixes(table: pa.Table) -> pa.Table:
    """Every request's prefix blocks made its own, as a redaction that re-keyed each request would."""
    hashes = [[(i << 20) + j + 1 for j in range(len(h))] for i, h in enumerate(table.column("block_hashes").to_pylist())]
    col = table.schema.get_field_index("block_hashes")
    return table.set_column(col, table.schema.field(col), pa.array(hashes, table.schema.field(col).type))


def _compressed_arrivals(table: pa.Table) -> pa.Table:
    """Arrival offsets at half their span, as a log read with the wrong clock would give."""
    col = table.schema.get_field_index("arrival_s")
    arrivals = [a * 0.5 for a in table.column("arrival_s").to_pylist()]
    return table.set_column(col, table.schema.field(col), pa.array(arrivals, pa.float64()))


@pytest.mark.parametrize("corrupt,drifted", [(_rekeyed_prefixes, "cached_token_ratio"),
                                             (_compressed_arrivals, "arrival.rate")])
def test_an_unfaithful_pool_fails_the_blocking_check_naming_the_drift(small_project, instance, corrupt, drifted):
    result = build_pool_and_check(small_project, instance, corrupt)
    assert not result.success  # a failed blocking check fails its run
    evaluation = check_evaluation(result)
    assert not evaluation.passed
    assert f"{drifted} drifted: production" in evaluation.description
    assert evaluation.metadata["n_failed"].value >= 1


def test_a_pool_built_without_a_production_timeline_fails_and_says_to_rebuild(small_project, instance):
    def drop_production(table):
        shutil.move(str(small_project / "out" / "lake" / "_pools" / "ep1" / "production.parquet"),
                    str(small_project / "production.parquet.old"))
        return table
    result = build_pool_and_check(small_project, instance, drop_production)
    evaluation = check_evaluation(result)
    assert not evaluation.passed and "rebuild" in evaluation.description


@pytest.mark.timeout(300)
def test_the_main_job_stops_before_any_candidate_when_the_replay_drifted(project, tmp_path):
    """A pool whose prefixes were re-keyed after it was built (reused: its logs are unchanged)."""
    from jobs.instance import instance as project_instance
    from jobs.main_job import demo_campaign, run_main_job
    from autoresearch_dagster.pool.sources import ensure_pool
    from .test_dagster_loop import SMALL

    logs = [project / "logs" / "chat.jsonl"]
    home = project / "out" / "lake" / "_pools" / "ep1"
    ensure_pool(logs, "ep1", home, fmt="auto", say=lambda _m: None)
    path = home / "replay_pool.parquet"
    table, meta = pq.read_table(path), pq.read_metadata(path).metadata
    pq.write_table(_rekeyed_prefixes(table).replace_schema_metadata(meta), path)
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="without its report"):
        run_main_job(project / "endpoints" / "ep1.yaml", out_dir=project / "out", settings=SMALL,
                     campaign=demo_campaign(budget_experiments=2, deadline_min=None, concurrent_gpus=1),
                     home=tmp_path / "home", say=lines.append)
    (stopped,) = [line for line in lines if "round 1" in line and "run " in line]
    assert "stopped by blocking check noise_baseline: replay_vs_production" in stopped
    assert "cached_token_ratio drifted: production" in stopped
    instance = project_instance(tmp_path / "home")
    for key in ("diagnostic_report", "proposals", "experiment_results", "promotion_decision"):
        assert not instance.fetch_materializations(dg.AssetKey(key), limit=1).records, key
