"""Kill and resume: SIGKILL a run's process group mid-experiment, on the project's instance with two GPU
slots. The run is left STARTED holding the interrupted step's slot until the orphaned-run sensor marks
it failed (giving the slot back); re-executed from failure, as the run-retry daemon does, only the
interrupted experiment runs again, and every experiment is counted once."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.config import GPU_POOL
from jobs.instance import prepare_dagster_home
from sensors.orphans import HOST_TAG, ORPHAN_TAG, orphaned_run_sensor

from .conftest import ROOT

EXPERIMENTS, INTERRUPTED = 5, 3


class Trace(dg.Config):
    dir: str


@dg.op(out=dg.DynamicOut(int))
def queue_experiments():
    for i in range(EXPERIMENTS):
        yield dg.DynamicOutput(i, mapping_key=f"exp_{i}")


@dg.op(pool=GPU_POOL)
def experiment(config: Trace, i: int) -> int:
    """Records each start and each finish; the interrupted one hangs while ``block`` exists."""
    trace = Path(config.dir)
    with open(trace / "started.log", "a") as f:
        f.write(f"{i}\n")
    while i == INTERRUPTED and (trace / "block").exists():
        time.sleep(0.2)
    time.sleep(0.3)
    with open(trace / "finished.log", "a") as f:
        f.write(f"{i}\n")
    return i


@dg.op
def collect(results: list[int]) -> list[int]:
    return sorted(results)


@dg.job(executor_def=dg.multiprocess_executor)
def resumable_experiments():
    collect(queue_experiments().map(experiment).collect())


def _succeeded_experiments(home: Path) -> set[str]:
    """The experiment steps Dagster has recorded as finished (what a from-failure re-execution keeps)."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        if not runs:
            return set()
        events = instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
        return {e.step_key for e in events if e.step_key and e.step_key.startswith("experiment[")}


def _lines(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.mark.timeout(150)
def test_a_killed_run_is_failed_frees_its_slot_and_resumes_without_rerunning_finished_experiments(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_GPU_SLOTS", "2")
    home = prepare_dagster_home(tmp_path / "home", storage="sqlite")
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "block").touch()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"execution": {"config": {"max_concurrent": EXPERIMENTS}},
                                      "loggers": {"console": {"config": {"log_level": "WARNING"}}},
                                      "ops": {"experiment": {"config": {"dir": str(trace)}}}}))
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "job", "execute",
                               "-m", "tests.dagster.test_dagster_kill_resume", "-j", "resumable_experiments",
                               "-c", str(config)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and worker.poll() is None:
            if (INTERRUPTED in _lines(trace / "started.log") and len(_lines(trace / "finished.log")) == EXPERIMENTS - 1
                    and len(_succeeded_experiments(home)) == EXPERIMENTS - 1):
                break
            time.sleep(0.5)
        assert worker.poll() is None, worker.stderr.read().decode()[-3000:]
        assert sorted(_lines(trace / "finished.log")) == [i for i in range(EXPERIMENTS) if i != INTERRUPTED]
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    (trace / "block").unlink()

    with dg.DagsterInstance.from_config(str(home)) as instance:
        (killed,) = instance.get_runs()
        assert killed.status == dg.DagsterRunStatus.STARTED  # what Dagster alone leaves behind
        held = {s.step_key for s in instance.event_log_storage.get_concurrency_info(GPU_POOL).claimed_slots}
        assert f"experiment[exp_{INTERRUPTED}]" in held  # (a finished step may not have handed its slot back yet)

        instance.add_run_tags(killed.run_id, {HOST_TAG: "another-host"})  # its pid means nothing here
        assert "no orphaned runs" in orphaned_run_sensor(dg.build_sensor_context(instance=instance)).skip_message
        instance.add_run_tags(killed.run_id, {HOST_TAG: socket.gethostname()})
        skip = orphaned_run_sensor(dg.build_sensor_context(instance=instance))
        assert killed.run_id in skip.skip_message
        killed = instance.get_run_by_id(killed.run_id)
        assert killed.status == dg.DagsterRunStatus.FAILURE and killed.tags[ORPHAN_TAG] == "true"
        assert instance.event_log_storage.get_concurrency_info(GPU_POOL).active_slot_count == 0
        assert "no orphaned runs" in orphaned_run_sensor(dg.build_sensor_context(instance=instance)).skip_message

        options = dg.ReexecutionOptions.from_failure(killed.run_id, instance)
        with dg.execute_job(dg.reconstructable(resumable_experiments), instance=instance,
                            reexecution_options=options) as resumed:
            assert resumed.success
            assert resumed.output_for_node("collect") == list(range(EXPERIMENTS))
            rerun_steps = {s.step_key for s in instance.get_run_step_stats(resumed.run_id)}
        assert rerun_steps == {f"experiment[exp_{INTERRUPTED}]", "collect"}
        assert not instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        assert instance.event_log_storage.get_concurrency_info(GPU_POOL).active_slot_count == 0
    assert sorted(_lines(trace / "finished.log")) == list(range(EXPERIMENTS))  # each experiment counted once
    started = _lines(trace / "started.log")
    assert started.count(INTERRUPTED) == 2
    assert all(started.count(i) == 1 for i in range(EXPERIMENTS) if i != INTERRUPTED)
