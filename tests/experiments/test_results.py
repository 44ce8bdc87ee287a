"""The results lake: append-only Parquet, typed empty views, question views, readers during writes."""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
import time

import duckdb
import pyarrow.parquet as pq
import pytest

from autoresearch_dagster.results import TABLES, ResultsLake, open_lake
from autoresearch_dagster.spec import SpecError

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def test_views_exist_and_are_typed_before_any_data(tmp_path):
    lake = open_lake(tmp_path / "lake")
    for table in list(TABLES) + ["capacity_by_config", "campaign_gain", "verdict_history"]:
        assert lake.query(f"SELECT count(*) FROM {table}") == [(0,)]
    cols = dict(lake.query("SELECT column_name, data_type FROM information_schema.columns WHERE table_name='runs'"))
    assert cols["capacity_rps"] == "DOUBLE" and cols["valid"] == "BOOLEAN" and cols["endpoint"] == "VARCHAR"


def test_append_is_hive_partitioned_atomic_and_append_only(tmp_path):
    lake = open_lake(tmp_path / "lake")
    p1 = lake.append("runs", [{"run_id": "a", "capacity_rps": 1.0, "valid": True, "server_info_json": {"v": 1}}],
                     endpoint="demo")
    p2 = lake.append("runs", [{"run_id": "b", "capacity_rps": 2.0, "valid": True}], endpoint="demo")
    assert p1 != p2 and p1.parent.name == "endpoint=demo" and p1.name.startswith("part-")
    assert not list(p1.parent.glob(".*"))  # no temp files left behind
    assert pq.read_table(p1).column("run_id").to_pylist() == ["a"]
    assert lake.query("SELECT endpoint, run_id, server_info_json FROM runs ORDER BY run_id") == [
        ("demo", "a", '{"v": 1}'), ("demo", "b", None)]
    with pytest.raises(SpecError):
        lake.append("runs", [{"run_id": "c"}], endpoint="../x")
    assert lake.append("runs", [], endpoint="demo") is None


def test_question_views_answer_gain_against_the_original_baseline(tmp_path):
    lake = open_lake(tmp_path / "lake")
    lake.append("campaigns", [{"campaign_id": "c1", "original_config_hash": "orig", "sla": "ttft_p99<=1s",
                               "created_at": NOW}], endpoint="demo")
    runs = [{"run_id": f"o{i}", "campaign_id": "c1", "config_hash": "orig", "capacity_rps": v, "valid": True,
             "capacity_rps_per_gpu": v / 2} for i, v in enumerate([10.0, 10.2, 9.8])]
    runs += [{"run_id": f"n{i}", "campaign_id": "c1", "config_hash": "new", "capacity_rps": v, "valid": True,
              "capacity_rps_per_gpu": v / 2} for i, v in enumerate([12.0, 12.2, 11.8])]
    runs += [{"run_id": "bad", "campaign_id": "c1", "config_hash": "new", "capacity_rps": 99.0, "valid": False,
              "capacity_rps_per_gpu": 49.5}]
    lake.append("runs", runs, endpoint="demo")
    lake.append("baselines", [{"campaign_id": "c1", "config_hash": "orig", "reason": "original", "recorded_at": NOW},
                              {"campaign_id": "c1", "config_hash": "new", "reason": "promotion",
                               "recorded_at": NOW + dt.timedelta(hours=1)}], endpoint="demo")
    gain = lake.query("SELECT original_rps_per_gpu, current_config_hash, current_rps_per_gpu, gain FROM campaign_gain")
    assert gain == [(5.0, "new", 6.0, pytest.approx(1.2))]
    by_cfg = dict(lake.query("SELECT config_hash, capacity_rps_median FROM capacity_by_config"))
    assert by_cfg == {"orig": 10.0, "new": 12.0}  # the invalid run is excluded


_READER = textwrap.dedent("""
    import sys, time, duckdb
    db, want = sys.argv[1], int(sys.argv[2])
    t0, counts, errors = time.monotonic(), [], 0
    while len(counts) + errors < want and time.monotonic() - t0 < 60:
        try:
            con = duckdb.connect(db, read_only=True)
            counts.append(con.execute("SELECT count(*) FROM runs").fetchone()[0])
            con.close()
        except duckdb.Error as e:
            errors += 1
            print("ERR", e, file=sys.stderr)
        time.sleep(0.01)
    print(len(counts), errors, counts[0], counts[-1], int(all(a <= b for a, b in zip(counts, counts[1:]))))
""")


def test_reader_in_another_process_queries_while_writes_continue(tmp_path):
    lake = open_lake(tmp_path / "lake")
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(lake.duckdb_path()), "40"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        written = 0
        t0 = time.monotonic()
        while reader.poll() is None and time.monotonic() - t0 < 90:  # write for as long as the reader reads
            lake.append("runs", [{"run_id": f"r{written}", "capacity_rps": 1.0, "valid": True}], endpoint="demo")
            written += 1
            if written % 10 == 0:
                lake.refresh_views()  # view rebuilds must not disturb readers either
        out, err = reader.communicate(timeout=30)
    finally:
        if reader.poll() is None:
            reader.kill()
    n_queries, errors, first, last, monotone = map(int, out.split())
    assert errors == 0, err
    assert n_queries == 40 and monotone == 1
    assert last > first  # the reader saw rows the writer added while it was reading
    assert lake.query("SELECT count(*) FROM runs") == [(written,)]


def test_writer_works_while_an_analyst_holds_the_file_open(tmp_path):
    lake = open_lake(tmp_path / "lake")
    analyst = duckdb.connect(str(lake.duckdb_path()), read_only=True)
    try:
        lake.append("verdicts", [{"verdict_id": "v1", "verdict": "same"}], endpoint="demo")
        lake.refresh_views()
        assert analyst.execute("SELECT verdict FROM verdicts").fetchall() == [("same",)]
    finally:
        analyst.close()


def test_unknown_tables_get_a_view_on_first_write(tmp_path):
    lake = ResultsLake(tmp_path / "lake")
    lake.append("findings", [{"finding_id": "f1", "kind": "workload", "title": "long prompts",
                              "detail_json": {"p50": 1}}], endpoint="demo")
    lake.append("custom_table", [{"x": 1}], endpoint="demo")
    assert lake.query("SELECT title FROM findings") == [("long prompts",)]
    assert lake.query("SELECT x, endpoint FROM custom_table") == [(1, "demo")]
