"""The real loop chain on the emulator: pool → baseline → noise → diagnosis → proposals →
experiment → decision, as one Dagster run with small measurement settings, then the promotion
sensor's run. Asserts what each asset recorded, in the instance, the artifact store and the lake."""
import json

import dagster as dg
import yaml

from autoresearch_dagster.definitions import execute, observe_engine_version
from autoresearch_dagster.results import ResultsLake
from conftest import make_defs
from resources import MeasurementSettings
from sensors import promotion_sensor

LOOP = ["replay_pool", "confirmed_baseline", "noise_baseline", "diagnostic_report", "proposals",
        "experiment_results", "promotion_decision"]
# Short steps starting near the knee: runs take ~1 s each in virtual time and still agree on capacity.
SMALL = MeasurementSettings(step_duration_s=15.0, min_completed=100, warmup_s=3.0, start_rps=8.0, max_steps=12,
                            resolution=0.1, noise_runs=5, initial_runs_per_arm=2, max_runs_per_arm=2,
                            quick_diagnosis=True)


def _md(instance, key):
    return instance.get_latest_materialization_event(dg.AssetKey(key)).asset_materialization.metadata


def test_real_chain_on_the_emulator(project, instance):
    (project / "candidates" / "ep1_chunk.yaml").write_text(yaml.safe_dump({"chunked_prefill_size": 4096}))
    defs = make_defs(project, SMALL)
    instance.add_dynamic_partitions("endpoints", ["ep1"])
    assert observe_engine_version(defs, instance).success
    result = execute(defs, instance, "ep1", [dg.AssetKey(k) for k in LOOP])
    assert result.success

    noise = _md(instance, "noise_baseline")
    assert noise["runs"].value == 5 and noise["capacity_rps"].value > 0
    assert 0 <= noise["capacity_cv"].value < 0.2
    report = json.loads((project / "out/ep1/diagnostic_report/report.json").read_text())
    assert report["hypotheses"] and report["findings"]
    props = json.loads((project / "out/ep1/proposals/proposals.json").read_text())
    assert props[0]["id"] == "ep1_chunk" and props[0]["intervention"] == {"chunked_prefill_size": 4096}
    assert all(p["falsifier"] and p["prediction"]["value"] > 1 for p in props)

    (verdict,) = _md(instance, "experiment_results")["verdicts"].value
    assert verdict["verdict"] in {"better", "same", "worse", "invalid"}
    assert verdict["candidate_id"] == "ep1_chunk" and verdict["runs_baseline"] >= 2
    gate = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("experiment_results"), "correctness_gate")])
    assert all(e.status.value == "SUCCEEDED" for e in gate.values())  # lossless: nothing to gate

    decision = _md(instance, "promotion_decision")
    assert decision["promote"].value == (verdict["verdict"] == "better" and verdict["confirmed"])

    lake = ResultsLake(project / "out" / "lake")
    n_runs = lake.query("SELECT count(*) FROM runs WHERE endpoint = 'ep1'")[0][0]
    assert n_runs >= 5 + 2 * verdict["runs_baseline"]
    assert lake.query("SELECT count(*) FROM experiments WHERE endpoint = 'ep1'")[0][0] == 1

    # a positive decision (reported like promotion_decision writes it) promotes through the sensor's run
    instance.report_runless_asset_event(dg.AssetMaterialization(
        "promotion_decision", partition="ep1",
        metadata={"promote": True, "candidate_id": "ep1_chunk", "experiment_id": verdict["experiment_id"],
                  "server_config_json": json.dumps({"chunked_prefill_size": 4096})}))
    tick = promotion_sensor(dg.build_sensor_context(instance=instance))
    (req,) = [r for r in tick.run_requests if r.run_config["ops"]["confirmed_baseline"]["config"]["candidate_id"]
              == "ep1_chunk"]
    run = execute(defs, instance, "ep1", [dg.AssetKey("confirmed_baseline")], run_config=req.run_config,
                  tags=req.tags)
    assert run.success
    baseline = _md(instance, "confirmed_baseline")
    assert baseline["candidate_id"].value == "ep1_chunk" and not baseline["is_original"].value
    assert lake.query("SELECT count(*) FROM baselines WHERE endpoint = 'ep1' AND reason = 'promotion'")[0][0] == 1
    # the promoted decision is not promoted twice, even from a reset cursor
    again = promotion_sensor(dg.build_sensor_context(instance=instance))
    assert all(r.run_config["ops"]["confirmed_baseline"]["config"]["candidate_id"] != "ep1_chunk"
               for r in again.run_requests)
