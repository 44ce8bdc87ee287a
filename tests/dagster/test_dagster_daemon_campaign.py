"""A campaign under `autoresearch serve` (dagster-webserver + dagster-daemon on a SQLite instance in tmp)
with no human action and no sensor called by the test: the daemon's sensors and the automation sensor
alone take an endpoint from discovery through the pool, the baseline, its noise floor, the diagnosis, the
proposals and the experiments to a promotion and the rerun at the new baseline. While the daemon runs an
analyst queries the results in DuckDB (read-only views over the lake). Then the endpoint's engine reports
a new version and the daemon alone re-measures and re-diagnoses it, in a run tagged with the reason.

What it waits for: each milestone as an asset materialization (or a run) in the instance, polled in
order. Slow by nature: every step is a run the daemon's launcher starts in a process of its own, so the
chain takes minutes on 2 cores (sensors tick every 2 s; the smallest campaign test_dagster_loop runs:
short steps, 5 noise runs (the least a noise floor takes), 3 runs per arm, 2 experiments a round, no probes)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from autoresearch_dagster.results import ResultsLake

from .conftest import ROOT
from .procs import free_port, group_alive

EP = "ep1"
MEASURE = {"step_duration_s": 10.0, "min_completed": 60, "warmup_s": 2.0, "start_rps": 8.0, "max_steps": 12,
           "resolution": 0.1, "noise_runs": 5, "initial_runs_per_arm": 3, "max_runs_per_arm": 3,
           "quick_diagnosis": True, "diagnosis_probes": False}
# budget left after the promotion's round, so the campaign is still running when the engine version changes
CAMPAIGN = {"budget_experiments": 8, "deadline_min": None, "concurrent_gpus": 1, "experiments_per_round": 2,
            "directions_per_round": 2, "search_trials": 0}
CHAIN_S, BUMP_S = 900, 600  # generous: the chain took about 5 minutes on the shared 2-core machine (load 11)


def _mats(instance: dg.DagsterInstance, key: str) -> list[dg.EventLogRecord]:
    return list(instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[EP]), limit=100, ascending=True).records)


def _md(rec: dg.EventLogRecord, key: str):
    v = rec.asset_materialization.metadata.get(key)
    return None if v is None else v.value


class Chain:
    """The campaign's milestones, each found once in the instance, in order: (name, storage id, run id)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []

    def _first(self, name: str, recs: list[dg.EventLogRecord], after: int) -> None:
        if name in {n for n, _, _ in self.seen}:
            return
        rec = next((r for r in recs if r.storage_id > after), None)
        if rec is not None:
            self.seen.append((name, rec.storage_id, rec.run_id))

    def last(self) -> int:
        return self.seen[-1][1] if self.seen else 0

    def update(self, instance: dg.DagsterInstance) -> None:
        baselines = _mats(instance, "confirmed_baseline")
        steps = [("replay_pool", _mats(instance, "replay_pool")),
                 ("baseline", [r for r in baselines if _md(r, "is_original")]),
                 ("noise", _mats(instance, "noise_baseline")),
                 ("diagnosis", _mats(instance, "diagnostic_report")),
                 ("proposals", _mats(instance, "proposals")),
                 ("experiments", _mats(instance, "experiment_results")),
                 ("promotion", [r for r in _mats(instance, "promotion_decision") if _md(r, "promote")]),
                 ("new baseline", [r for r in baselines if not _md(r, "is_original")]),
                 ("noise at the new baseline", _mats(instance, "noise_baseline"))]
        for name, recs in steps:
            if len(self.seen) == [n for n, _ in steps].index(name):
                # discovery's one run writes the pool and the baseline in either order
                self._first(name, recs, 0 if name == "baseline" else self.last())

    def done(self) -> bool:
        return len(self.seen) == 9

    def names(self) -> list[str]:
        return [n for n, _, _ in self.seen]


@pytest.mark.slow  # minutes: waits for the daemon to run a whole campaign, then for an engine-version run
@pytest.mark.timeout(CHAIN_S + BUMP_S + 120)
def test_the_daemon_alone_runs_a_campaign_to_a_promotion_and_remeasures_on_an_engine_version_bump(project, tmp_path):
    home, port, log = tmp_path / "home", free_port(), tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTORESEARCH_CANDIDATES": str(project / "candidates"),
           "AUTORESEARCH_GPU_SLOTS": "1", "AUTORESEARCH_SENSOR_INTERVAL_S": "2",
           "AUTORESEARCH_MEASURE_JSON": json.dumps(MEASURE), "AUTORESEARCH_CAMPAIGN_JSON": json.dumps(CAMPAIGN),
           "AUTORESEARCH_PROPOSER": "offline"}
    env.pop("DAGSTER_HOME", None)
    spec = project / "endpoints" / f"{EP}.yaml"
    lake = ResultsLake(project / "out" / "lake")
    with open(log, "w") as out:
        serve = subprocess.Popen([sys.executable, "-m", "jobs.serve", "--dagster-home", str(home), "--port", str(port),
                                  "--endpoints", str(project / "endpoints"), "--out", str(project / "out")],
                                 cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    pgids: list[int] = []
    chain, analyst, t0 = Chain(), None, time.monotonic()
    try:
        # 1. discovery -> ... -> promotion -> noise at the new baseline, the daemon alone
        while time.monotonic() - t0 < CHAIN_S and serve.poll() is None and not chain.done():
            if "daemon pid" in log.read_text():
                pgids = pgids or [int(p) for p in re.findall(r"(?:webserver|daemon) pid (\d+)", log.read_text())]
                with dg.DagsterInstance.from_config(str(home)) as instance:
                    chain.update(instance)
                    failed = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
                    assert not failed, f"run {failed[0].run_id} failed\n{_run_errors(instance, failed[0])}"
                # an analyst queries the experiments while the daemon runs (read-only DuckDB views)
                if analyst is None and "experiments" in chain.names():
                    analyst = lake.query("SELECT count(*), count(DISTINCT experiment_id) FROM experiments "
                                         "WHERE endpoint = ?", [EP])[0]
            time.sleep(2)
        chain_s = time.monotonic() - t0
        assert serve.poll() is None, log.read_text()
        assert chain.done(), f"after {chain_s:.0f} s the chain reached only {chain.names()}\n{_tail(home)}"
        assert analyst is not None and analyst[0] >= 1 and analyst[0] == analyst[1]  # rows while the daemon ran

        with dg.DagsterInstance.from_config(str(home)) as instance:
            runs = instance.get_runs()
            # every run came from a sensor of the daemon, queued and launched by the run launcher
            assert runs and all(r.tags.get("dagster/sensor_name") for r in runs), [r.tags for r in runs]
            for r in runs:
                assert instance.all_logs(r.run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED), r.run_id
            by_sensor = {r.tags["dagster/sensor_name"] for r in runs}
            assert {"endpoint_discovery_sensor", "loop_automation", "promotion_sensor"} <= by_sensor
            milestone = {n: (sid, run) for n, sid, run in chain.seen}
            assert instance.get_run_by_id(milestone["new baseline"][1]).tags["dagster/sensor_name"] == "promotion_sensor"
            rerun = next(r for r in _mats(instance, "noise_baseline")
                         if r.storage_id == milestone["noise at the new baseline"][0])
            assert _md(rerun, "era") == 1  # the promoted config's own noise floor
            old_version = _md(rerun, "engine_version")
        print(f"\nchain under the daemon: {' -> '.join(chain.names())} in {chain_s:.0f} s; analyst saw "
              f"{analyst[0]} experiment rows")

        # 2. the engine reports a new version: the daemon alone re-measures and re-diagnoses
        spec.write_text(spec.read_text().replace("engine_options: {hidden_factors_seed: 7}",
                                                 "engine_options: {hidden_factors_seed: 7, release: r2}"))
        t1, bump = time.monotonic(), None
        while time.monotonic() - t1 < BUMP_S and serve.poll() is None:
            with dg.DagsterInstance.from_config(str(home)) as instance:
                runs = instance.get_runs(dg.RunsFilter(tags={"autoresearch/reason": "engine version bump"}))
                if runs and runs[0].is_finished:
                    bump = runs[0]
                    break
            time.sleep(2)
        bump_s = time.monotonic() - t1
        assert bump is not None, f"no engine-version run finished within {BUMP_S} s\n{_tail(home)}"
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert bump.status == dg.DagsterRunStatus.SUCCESS, _run_errors(instance, bump)
            assert len(instance.get_runs(dg.RunsFilter(tags={"autoresearch/reason": "engine version bump"}))) == 1
            assert bump.tags["dagster/sensor_name"] == "engine_version_sensor"
            assert bump.tags["autoresearch/engine_version"].endswith("+r2")
            noise = [r for r in _mats(instance, "noise_baseline") if r.run_id == bump.run_id]
            diagnosis = [r for r in _mats(instance, "diagnostic_report") if r.run_id == bump.run_id]
            assert noise and diagnosis, "the bump run did not re-measure and re-diagnose"
            new_version = _md(noise[0], "engine_version")
            assert new_version.endswith("+r2") and new_version != old_version
            observed = instance.fetch_observations(dg.AssetKey("engine_version"), limit=1).records[0]
            assert "+r2" in observed.asset_observation.data_version
        # the earlier noise floors stay in the lake, each with the version it was measured on
        versions = {v for (v,) in lake.query("SELECT DISTINCT engine_version FROM noise WHERE endpoint = ?", [EP])}
        assert {old_version, new_version} <= versions
        print(f"engine version bump {old_version} -> {new_version}: re-measured and re-diagnosed by the daemon "
              f"in {bump_s:.0f} s")

        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, log.read_text()
        assert not [p for p in pgids if group_alive(p)], "a server's process group outlived serve"
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait(timeout=10)
        for p in pgids:
            if group_alive(p):
                os.killpg(p, signal.SIGKILL)


def _run_errors(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    out = []
    for e in instance.all_logs(run.run_id):
        de = e.dagster_event
        if de and de.is_failure:
            err = de.step_failure_data.error if de.is_step_failure and de.step_failure_data else None
            out.append(str(e.message)[:400] + (f"\n{err.to_string()[-1500:]}" if err else ""))
    return "\n".join(out)


def _tail(home: Path) -> str:
    logs = home / "logs"
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log"))) if logs.exists() else ""
