"""Owns the orphaned-run sweep: a run whose local run worker died (SIGKILL, OOM, a host reboot) is marked
failed and its GPU slots are given back, so no run stays STARTED forever and the run-retry daemon
re-executes it from failure (the steps that finished are not rerun).

Dagster's run monitoring detects dead workers only for launchers that can check a worker's health
(Docker, Kubernetes, ECS); the default launcher starts workers as local processes and cannot, so this
sweep checks the process that started each run on this host: runs the default launcher started (on the
daemon's host), and in-process runs tagged with this host's name (``HOST_TAG``)."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import dagster as dg

from sensors.interval import interval

ORPHAN_TAG = "autoresearch/orphaned"
# The host that executes a run in process (jobs.instance.execute): a pid means something only there.
HOST_TAG = "autoresearch/host"


def _process_start(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds), None when no such process; Linux's /proc, else a liveness probe."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/stat").exists():
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return None
        if fields[0] == "Z":  # a zombie has finished its run
            return None
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return 0.0


def run_worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of the process that started the run (what emitted its RUN_START)."""
    starts = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_START)
    return starts[-1].dagster_event.pid if starts and starts[-1].dagster_event else None


def fail_orphaned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed every STARTED run whose worker process is gone (or whose pid now names a newer process),
    and free the concurrency slots it held; returns their run ids."""
    from dagster._core.events import JobFailureData, RunFailureReason
    from dagster._core.launcher import DefaultRunLauncher

    if not isinstance(instance.run_launcher, DefaultRunLauncher):
        return []  # workers elsewhere: the launcher's own health check (run monitoring) owns them
    failed, here = [], socket.gethostname()
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        run = record.dagster_run
        if run.tags.get(HOST_TAG, here) != here:
            continue  # another host's process: its own sweep judges it
        pid = run_worker_pid(instance, run.run_id)
        if pid is None:
            continue
        started = _process_start(pid)
        if started is not None and started <= (record.start_time or record.create_timestamp.timestamp()) + 1.0:
            continue
        instance.add_run_tags(run.run_id, {ORPHAN_TAG: "true"})
        # UNEXPECTED_TERMINATION, not a step failure: the run-retry daemon retries it even when asset failures
        # are not retried (run_retries.retry_on_asset_or_op_failure: false in the instance config)
        crashed = JobFailureData(error=None, first_step_failure_event=None,
                                 failure_reason=RunFailureReason.UNEXPECTED_TERMINATION)
        instance.report_run_failed(run, f"run worker (pid {pid}) is gone: the run was killed mid-flight; "
                                        "it resumes from failure (finished steps are kept)", job_failure_data=crashed)
        if instance.event_log_storage.supports_global_concurrency_limits:
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        failed.append(run.run_id)
    return failed


@dg.sensor(minimum_interval_seconds=interval(30), default_status=dg.DefaultSensorStatus.RUNNING)
def orphaned_run_sensor(context: dg.SensorEvaluationContext):
    """Marks failed the runs whose local run worker died, so the run-retry daemon resumes them."""
    failed = fail_orphaned_runs(context.instance)
    return dg.SkipReason(f"marked failed (worker gone): {', '.join(failed)}" if failed else "no orphaned runs")
