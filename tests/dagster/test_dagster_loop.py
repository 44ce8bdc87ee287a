"""The main job on the emulator with small settings: a research campaign through real Dagster runs, from
discovery to the campaign report, with promotions, lineage reruns and next rounds driven by the sensors.
Asserts what the assets recorded in the instance, the artifact store, the memory and the results lake."""
import json

import dagster as dg
import pytest

from assets.approval import ApprovalConfig
from jobs.instance import instance as project_instance
from jobs.main_job import demo_campaign, run_main_job
from autoresearch_dagster.definitions import build_defs
from autoresearch_dagster.results import ResultsLake
from resources import MeasurementSettings
from sensors import promotion_sensor

# Short steps starting near the knee: runs take a fraction of a second in virtual time; diagnosis
# without probes (the diagnosis tests cover them).
SMALL = MeasurementSettings(step_duration_s=10.0, min_completed=60, warmup_s=2.0, start_rps=8.0, max_steps=12,
                            resolution=0.1, noise_runs=5, initial_runs_per_arm=3, max_runs_per_arm=3,
                            quick_diagnosis=True, diagnosis_probes=False)


def _mats(instance, key):
    return [r.asset_materialization.metadata for r in instance.fetch_materializations(
        dg.AssetKey(key), limit=100, ascending=True).records]


@pytest.mark.timeout(600)  # the whole main job (a campaign's rounds through Dagster): about 220 s on 2 idle cores
def test_main_job_runs_a_campaign_of_the_systems_own_proposals_to_its_report(project, tmp_path):
    lines = []
    campaign = demo_campaign(budget_experiments=3, deadline_min=None, concurrent_gpus=1, experiments_per_round=2,
                             directions_per_round=2, search_trials=0)
    summary = run_main_job(project / "endpoints" / "ep1.yaml", out_dir=project / "out", settings=SMALL,
                           campaign=campaign, home=tmp_path / "home", say=lines.append)
    report = summary["report"]
    assert report["experiments"] and all(e["source"] in ("offline", "orchestrator") for e in report["experiments"])
    assert report["ended_because"] and report["original_capacity_rps"] > 0
    assert any("promotion sensor promotes" in line for line in lines)  # the demo finds a confirmed gain
    assert any("automation sensor requests" in line and "noise_baseline" in line for line in lines)
    assert report["gain"] > 1.05 and report["best_config"] != report["original_config"]

    instance = project_instance(tmp_path / "home")
    baselines = _mats(instance, "confirmed_baseline")
    assert baselines[0]["is_original"].value and not baselines[-1]["is_original"].value
    assert "promoted_from" in baselines[-1]
    assert len(_mats(instance, "noise_baseline")) == len(baselines)  # each working baseline measured once
    decisions = _mats(instance, "promotion_decision")
    assert decisions[-1]["next"].value == "end"
    assert len(_mats(instance, "campaign_report")) == 1
    steps = instance.get_run_records(dg.RunsFilter(tags={"dagster/sensor_name": "campaign_sensor"}))
    assert steps  # the report (and any next round) came through the campaign sensor
    gate = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("experiment_results"), "correctness_gate")])
    assert all(e.status.value == "SUCCEEDED" for e in gate.values())  # nothing promotable bypassed the gate
    replay = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("noise_baseline"), "replay_vs_production")])
    assert replay and all(e.status.value == "SUCCEEDED" for e in replay.values())  # the demo pool replays faithfully

    out = project / "out" / "ep1" / "campaign"
    assert (out / "campaign.json").exists() and (out / "review" / "README.md").exists()
    plans = sorted((out / "rounds").glob("*/plan.json"))
    props = json.loads(plans[0].read_text())["proposals"]
    assert all(p["falsification"] and p["explanation"] and p["trace"] for p in props)
    lake = ResultsLake(project / "out" / "lake")
    assert lake.query("SELECT count(*) FROM experiments WHERE endpoint = 'ep1'")[0][0] == len(report["experiments"])
    assert lake.query("SELECT count(*) FROM predictions WHERE endpoint = 'ep1'")[0][0] == len(report["experiments"])
    assert lake.query("SELECT count(*) FROM campaign_results WHERE endpoint = 'ep1'")[0][0] == 1
    assert lake.query("SELECT count(*) FROM findings WHERE endpoint = 'ep1'")[0][0] >= 1
    assert (project / "out" / "memory" / "endpoints" / "ep1.jsonl").exists()

    # the executed promotions are not requested again, even by a sensor whose cursor was reset
    promoted = {m["candidate_id"].value for m in baselines[1:]}
    again = promotion_sensor(dg.build_sensor_context(instance=instance))
    assert all(r.run_config["ops"]["confirmed_baseline"]["config"]["candidate_id"] not in promoted
               for r in again.run_requests)

    # a person approves the result: a recorded action the UI (asset metadata) and the lake show
    defs = build_defs(out_dir=str(project / "out"), spec_dir=str(project / "endpoints"), settings=SMALL,
                      campaign=campaign)
    job = defs.resolve_job_def("approve_production")
    res = job.execute_in_process(instance=instance, partition_key="ep1", run_config=dg.RunConfig(
        ops={"production_approval": ApprovalConfig(who="ops-lead", decision="approve", note="ship it")}))
    assert res.success
    assert _mats(instance, "production_approval")[-1]["decision"].value == "approve"
    lake.refresh_views()
    assert lake.query("SELECT who, decision FROM approvals WHERE endpoint = 'ep1'") == [("ops-lead", "approve")]


def test_measurement_settings_carry_the_steady_state_hold_to_the_harness():
    held = MeasurementSettings(hold_e2e_multiple=10.0)
    assert held.harness().capacity.hold_e2e_multiple == 10.0
    assert MeasurementSettings().capacity().hold_e2e_multiple == 0.0
    assert MeasurementSettings(profile="quick").capacity().hold_e2e_multiple == 10.0  # make run's steady-state profile
