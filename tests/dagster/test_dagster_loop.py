"""The main job on the emulator with small settings: real Dagster runs from discovery to the
promotion and the lineage rerun the automation conditions select. Asserts what each asset
recorded in the instance, the artifact store and the results lake."""
import json

import dagster as dg
import yaml

from jobs.instance import instance as project_instance
from jobs.main_job import run_main_job
from autoresearch_dagster.results import ResultsLake
from resources import MeasurementSettings
from sensors import promotion_sensor

# Short steps starting near the knee: runs take ~2 s each in virtual time and still agree on capacity;
# diagnosis without probes (the diagnosis tests cover them).
SMALL = MeasurementSettings(step_duration_s=10.0, min_completed=60, warmup_s=2.0, start_rps=8.0, max_steps=12,
                            resolution=0.1, noise_runs=5, initial_runs_per_arm=2, max_runs_per_arm=2,
                            quick_diagnosis=True, diagnosis_probes=False)


def _mats(instance, key):
    return [r.asset_materialization.metadata for r in instance.fetch_materializations(
        dg.AssetKey(key), limit=100, ascending=True).records]


def test_main_job_promotes_and_the_automation_reruns_the_lineage(project, tmp_path):
    # the candidate the emulator's grid found for the demo: mixed chunks relieve prefill interference
    (project / "candidates" / "ep1_better.yaml").write_text(yaml.safe_dump({"enable_mixed_chunk": True}))
    lines = []
    summary = run_main_job(project / "endpoints" / "ep1.yaml", out_dir=project / "out",
                           candidates_dir=project / "candidates", settings=SMALL, home=tmp_path / "home",
                           say=lines.append)
    first, second = summary["rounds"]
    assert first["candidate"] == "ep1_better" and first["verdict"] == "better" and first["promote"] is True
    assert first["ratio"] > 1.1 and first["ci"][0] > 1.0
    assert second["baseline"].startswith("ep1_better")  # the rerun measured the promoted baseline
    assert second["capacity_rps"] > first["capacity_rps"]
    assert second["candidate"] != "ep1_better"  # already the baseline: not proposed again
    assert any("tick 1: requested" in line and "noise_baseline" in line for line in lines)

    instance = project_instance(tmp_path / "home")
    noise = _mats(instance, "noise_baseline")
    assert len(noise) == 2 and all(m["runs"].value == 5 for m in noise)
    assert all(0 <= m["capacity_cv"].value < 0.2 for m in noise)
    baselines = _mats(instance, "confirmed_baseline")
    assert [m["candidate_id"].value for m in baselines] == ["initial", "ep1_better"]
    assert "promoted_from" in baselines[1]
    runs = instance.get_run_records(dg.RunsFilter(tags={"autoresearch/main_job": "automation-tick-1"}))
    assert len(runs) == 1 and runs[0].dagster_run.is_success
    gate = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("experiment_results"), "correctness_gate")])
    assert all(e.status.value == "SUCCEEDED" for e in gate.values())  # lossless candidates: nothing to gate

    report = json.loads((project / "out/ep1/diagnostic_report/report.json").read_text())
    assert report["hypotheses"] and report["findings"]
    props = json.loads((project / "out/ep1/proposals/proposals.json").read_text())
    assert all(p["falsifier"] and p["prediction"]["value"] > 1 and p["explanation"] for p in props)

    lake = ResultsLake(project / "out" / "lake")
    assert lake.query("SELECT count(*) FROM experiments WHERE endpoint = 'ep1'")[0][0] == 2
    assert lake.query("SELECT count(*) FROM baselines WHERE endpoint = 'ep1' AND reason = 'promotion'")[0][0] == 1
    assert lake.query("SELECT count(*) FROM runs WHERE endpoint = 'ep1'")[0][0] >= 2 * 5 + 2 * 4

    # the executed promotion is not requested again, even by a sensor whose cursor was reset
    again = promotion_sensor(dg.build_sensor_context(instance=instance))
    assert all(r.run_config["ops"]["confirmed_baseline"]["config"]["candidate_id"] != "ep1_better"
               for r in again.run_requests)


def test_measurement_settings_carry_the_steady_state_hold_to_the_harness():
    held = MeasurementSettings(hold_e2e_multiple=10.0)
    assert held.harness().capacity.hold_e2e_multiple == 10.0
    assert MeasurementSettings().capacity().hold_e2e_multiple == 0.0
    assert MeasurementSettings(profile="quick").capacity().hold_e2e_multiple == 10.0  # make run's steady-state profile
