"""The ``gpu`` pool bounds GPU work: a real multiprocess run of five experiment steps on an instance the
project renders with two GPU slots (SQLite, and PostgreSQL where scripts/test.sh started one) never runs
more than two at once, and finishes all five."""
import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest

from assets.config import GPU_POOL
from jobs.instance import gpu_slots, prepare_dagster_home
from autoresearch_dagster.spec import SpecError

EXPERIMENTS = 5


class Trace(dg.Config):
    dir: str


@dg.op(out=dg.DynamicOut(int))
def queue_experiments():
    for i in range(EXPERIMENTS):
        yield dg.DynamicOutput(i, mapping_key=f"exp_{i}")


def _running_others(trace: Path, me: int) -> int:
    started = {p.stem.split("_")[1] for p in trace.glob("start_*")}
    ended = {p.stem.split("_")[1] for p in trace.glob("end_*")}
    return len(started - ended - {str(me)})


@dg.op(pool=GPU_POOL)
def experiment(config: Trace, i: int) -> int:
    """Holds its slot until a peer runs beside it (or 6 s pass): without the bound all five would overlap."""
    trace = Path(config.dir)
    (trace / f"start_{i}.json").write_text(json.dumps(time.time()))
    deadline = time.time() + 6
    while time.time() < deadline and not _running_others(trace, i):
        time.sleep(0.05)
    time.sleep(1.0)
    (trace / f"end_{i}.json").write_text(json.dumps(time.time()))
    return i


@dg.op
def collect(results: list[int]) -> list[int]:
    return sorted(results)


@dg.job(executor_def=dg.multiprocess_executor)
def five_experiments():
    collect(queue_experiments().map(experiment).collect())


def _peak_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])  # an end sorts first
    peak = now = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def _fresh_postgres_db(monkeypatch) -> None:
    if not os.environ.get("DAGSTER_PG_HOST"):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DAGSTER_PG_* not set in CI: scripts/test.sh must start PostgreSQL (scripts/pg.sh)")
        pytest.skip("no PostgreSQL server: run through scripts/test.sh")
    import psycopg2

    db = f"slots_{os.getpid()}"
    conn = psycopg2.connect(host=os.environ["DAGSTER_PG_HOST"], port=os.environ["DAGSTER_PG_PORT"],
                            user=os.environ["DAGSTER_PG_USERNAME"], dbname=os.environ["DAGSTER_PG_DB"])
    conn.autocommit = True
    conn.cursor().execute(f"CREATE DATABASE {db}")
    conn.close()
    monkeypatch.setenv("DAGSTER_PG_DB", db)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_gpu_slots_run_five_experiments_two_at_a_time(storage, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_GPU_SLOTS", "2")
    if storage == "postgres":
        _fresh_postgres_db(monkeypatch)
    home = prepare_dagster_home(tmp_path / "home", storage=storage)
    assert "default_limit: 2" in (home / "dagster.yaml").read_text()
    trace = tmp_path / "trace"
    trace.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        with dg.execute_job(dg.reconstructable(five_experiments), instance=instance, run_config={
                # the executor alone would start all five: the pool is what bounds them
                "execution": {"config": {"max_concurrent": EXPERIMENTS}},
                "loggers": {"console": {"config": {"log_level": "WARNING"}}},
                "ops": {"experiment": {"config": {"dir": str(trace)}}}}) as result:
            assert result.success
            assert result.output_for_node("collect") == list(range(EXPERIMENTS))
        info = instance.event_log_storage.get_concurrency_info(GPU_POOL)
        assert info.slot_count == 2 and info.active_slot_count == 0  # every slot given back
    intervals = [tuple(json.loads((trace / f"{edge}_{i}.json").read_text()) for edge in ("start", "end"))
                 for i in range(EXPERIMENTS)]
    assert _peak_overlap(intervals) == 2


def test_gpu_slots_follow_the_gpus_visible(monkeypatch):
    monkeypatch.delenv("AUTORESEARCH_GPU_SLOTS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,3")
    assert gpu_slots() == 3
    monkeypatch.setenv("AUTORESEARCH_GPU_SLOTS", "0")
    with pytest.raises(SpecError, match="AUTORESEARCH_GPU_SLOTS"):
        gpu_slots()


def test_every_step_that_loads_an_engine_takes_a_gpu_slot():
    from autoresearch_dagster.definitions import defs

    job = defs.resolve_implicit_global_asset_job_def()
    pools = {op.name: op.pool for op in job.graph.iterate_op_defs()}
    for step in ("noise_baseline", "diagnostic_report", "run_experiment_step"):
        assert pools[step] == GPU_POOL, step
    check_pools = {n: p for n, p in pools.items() if "replay_vs_production" in n}
    assert check_pools and set(check_pools.values()) == {GPU_POOL}
    assert pools["collect_round"] is None and pools["round_experiments"] is None
