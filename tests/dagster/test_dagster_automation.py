"""Declarative automation of the loop, evaluated tick by tick with evaluate_automation_conditions.

Materializations and check results are reported as runless events so the conditions are tested
fast and in isolation; test_dagster_loop.py executes the real chain."""
import datetime
import uuid

import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.instance.utils import RUNLESS_JOB_NAME
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from autoresearch_dagster.definitions import defs

EP = "ep1"
DOWNSTREAM = {"noise_baseline", "diagnostic_report", "proposals", "experiment_results", "promotion_decision"}


def mat(instance, key, partition=EP):
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition=partition))


def check(instance, asset, name, passed, partition=EP):
    """A check result pointing at the asset's latest materialization, as an executed check records it."""
    latest = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1).records[0]
    evaluation = dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(asset), check_name=name, passed=passed, partition=partition,
        severity=dg.AssetCheckSeverity.ERROR,
        target_materialization_data=AssetCheckEvaluationTargetMaterializationData(
            storage_id=latest.storage_id, run_id=latest.run_id, timestamp=latest.timestamp))
    # report_runless_asset_event stores every check result under run id "", and check executions
    # are unique per (check, run, partition): give each simulated execution its own run id.
    instance.report_dagster_event(
        DagsterEvent(event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION.value,
                     event_specific_data=evaluation, job_name=RUNLESS_JOB_NAME),
        run_id=uuid.uuid4().hex)


def observe_engine(instance, version):
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key="engine_version", tags={"dagster/data_version": version}))


def requested(result) -> set[str]:
    """Requested assets, less engine_version: its cron condition follows the wall clock
    (test_engine_version_cron drives it with evaluation_time)."""
    return {r.key.to_user_string() for r in result.results
            if isinstance(r.key, dg.AssetKey) and r.true_subset.size > 0} - {"engine_version"}


class Ticker:
    """Chains evaluations: each tick passes the previous cursor; ``run`` 'executes' what was requested."""

    def __init__(self, instance):
        self.instance, self.cursor = instance, None

    def tick(self) -> set[str]:
        res = dg.evaluate_automation_conditions(defs=defs, instance=self.instance, cursor=self.cursor)
        self.cursor = res.cursor
        return requested(res)

    def run(self, keys, *, gate_passed=True, replay_passed=True):
        for key in ["noise_baseline", "diagnostic_report", "proposals", "experiment_results",
                    "promotion_decision"]:
            if key in keys:
                mat(self.instance, key)
                if key == "noise_baseline":
                    check(self.instance, "noise_baseline", "replay_vs_production", replay_passed)
                if key == "experiment_results":
                    check(self.instance, "experiment_results", "correctness_gate", gate_passed)


def seed(instance) -> Ticker:
    """An endpoint after discovery's first run (pool + passing fidelity + baseline) and an engine
    observation, with its first round done: the steady state a promotion starts from."""
    instance.add_dynamic_partitions("endpoints", [EP])
    t = Ticker(instance)
    assert t.tick() == set()
    observe_engine(instance, "emulator:1")
    mat(instance, "replay_pool")
    check(instance, "replay_pool", "replay_fidelity", True)
    mat(instance, "confirmed_baseline")
    first = t.tick()
    assert {"noise_baseline", "diagnostic_report", "proposals", "experiment_results"} <= first
    t.run(first)
    second = t.tick()
    t.run(second)  # promotion_decision waits for the correctness gate of the same round
    assert "promotion_decision" in first | second
    assert t.tick() == set()
    return t


def test_promotion_reruns_the_lineage_and_a_failed_gate_stops_the_decision(instance):
    t = seed(instance)
    mat(instance, "confirmed_baseline")  # what the promotion sensor's run does
    got = t.tick()
    assert DOWNSTREAM - {"promotion_decision"} <= got
    assert not {"confirmed_baseline", "replay_pool"} & got
    t.run(got)
    got2 = t.tick()
    assert "promotion_decision" in got | got2
    t.run(got2)
    assert t.tick() == set()

    mat(instance, "confirmed_baseline")  # the next promotion, whose experiment fails its gate
    got = t.tick()
    t.run(got - {"promotion_decision"}, gate_passed=False)
    assert "promotion_decision" not in t.tick()
    assert "promotion_decision" not in t.tick()


def test_failed_fidelity_blocks_downstream_and_engine_bump_reruns_diagnosis(instance):
    t = seed(instance)
    mat(instance, "replay_pool")  # new logs rebuilt the pool, and it is not faithful
    check(instance, "replay_pool", "replay_fidelity", False)
    assert t.tick() == set()
    check(instance, "replay_pool", "replay_fidelity", True)  # re-run check passes
    got = t.tick()
    assert "noise_baseline" in got
    t.run(got)
    t.run(t.tick())
    assert t.tick() == set()

    observe_engine(instance, "emulator:1")  # same version: nothing to do
    assert t.tick() == set()
    observe_engine(instance, "emulator:2")
    got = t.tick()
    assert {"noise_baseline", "diagnostic_report"} <= got
    assert not {"confirmed_baseline", "replay_pool"} & got


def test_a_replay_that_drifted_from_production_stops_the_candidates_until_the_pool_is_rebuilt(instance):
    t = seed(instance)
    mat(instance, "confirmed_baseline")  # a promotion: one run from the noise floor down
    got = t.tick()
    assert {"noise_baseline", "diagnostic_report", "proposals"} <= got
    t.run({"noise_baseline"}, replay_passed=False)  # the check fails: the run skips everything below
    assert t.tick() == set() and t.tick() == set()  # no candidate is compared on this pool
    mat(instance, "replay_pool")  # new logs: a rebuilt pool, faithful again
    check(instance, "replay_pool", "replay_fidelity", True)
    got = t.tick()
    assert {"noise_baseline", "diagnostic_report", "proposals"} <= got
    t.run(got)
    t.run(t.tick())
    assert t.tick() == set()


def test_engine_version_is_observed_on_its_cron(instance):
    start = datetime.datetime(2026, 1, 1, 12, 1)
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=start)
    assert first.get_num_requested(dg.AssetKey("engine_version")) == 0
    later = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor,
                                              evaluation_time=start + datetime.timedelta(minutes=10))
    assert later.get_num_requested(dg.AssetKey("engine_version")) == 1


def test_a_sensor_run_that_remeasured_with_its_check_is_not_followed_by_the_check_again(instance):
    """The engine-version sensor's run materializes noise_baseline and runs replay_vs_production with it:
    the automation sensor requests what is below, not the replay check a second time."""
    t = seed(instance)
    replay = dg.AssetCheckKey(dg.AssetKey("noise_baseline"), "replay_vs_production")
    job = defs.resolve_implicit_global_asset_job_def()
    run = instance.create_run_for_job(job, asset_selection=frozenset({dg.AssetKey("noise_baseline"),
                                                                      dg.AssetKey("diagnostic_report")}),
                                      tags={"dagster/partition": EP})  # the sensor's run, in progress
    # its noise floor is in; its check has not run yet
    instance.report_dagster_event(DagsterEvent(
        event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value, job_name=job.name,
        event_specific_data=StepMaterializationData(dg.AssetMaterialization("noise_baseline", partition=EP))),
        run_id=run.run_id)
    res = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=t.cursor)
    assert replay not in {r.key for r in res.results if not r.true_subset.is_empty}
    check(instance, "noise_baseline", "replay_vs_production", True)
    mat(instance, "diagnostic_report")
    instance.report_run_failed(run)  # the run is over (how does not matter here)
    res = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=res.cursor)
    got = {r.key for r in res.results if not r.true_subset.is_empty}
    assert dg.AssetKey("proposals") in got and replay not in got
    mat(instance, "confirmed_baseline")  # a promotion: the automation sensor requests the check with the noise floor
    res = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=res.cursor)
    got = {r.key for r in res.results if not r.true_subset.is_empty}
    assert {dg.AssetKey("noise_baseline"), replay} <= got
