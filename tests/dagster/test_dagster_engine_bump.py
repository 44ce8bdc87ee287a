"""An engine version bump after a campaign has ended, through real Dagster runs: the engine_version sensor
requests the re-measure, and its run starts a new campaign (its id names the new version) that measures a
noise floor of its own on the new version; the ended campaign is archived, nothing of it is reused."""
import json
from pathlib import Path

import dagster as dg

from jobs.instance import execute
from resources import CampaignResource, EndpointRegistry, EngineFactory, MeasurementSettings
from sensors import engine_version_sensor
from autoresearch_dagster.definitions import build_defs
from autoresearch_dagster.results import ResultsLake

from .conftest import ROOT, write_spec

LINES = 300  # the first minutes of the demo log: a small pool
SMALL = MeasurementSettings(step_duration_s=6.0, min_completed=20, warmup_s=1.0, start_rps=16.0, max_steps=10,
                            resolution=0.2, noise_runs=5, quick_diagnosis=True, diagnosis_probes=False)
KEYS = ("replay_pool", "confirmed_baseline", "noise_baseline", "diagnostic_report")


def _state(project) -> dict:
    return json.loads((project / "out" / "ep1" / "campaign" / "state.json").read_text())


def _noise(instance) -> list[dict]:
    return [r.asset_materialization.metadata for r in instance.fetch_materializations(
        dg.AssetKey("noise_baseline"), limit=10, ascending=True).records]


def test_a_bump_after_the_campaign_ended_starts_a_new_campaign_with_its_own_noise_floor(tmp_path, instance):
    logs, specs = tmp_path / "logs", tmp_path / "endpoints"
    logs.mkdir(), specs.mkdir(), (tmp_path / "candidates").mkdir()
    head = (ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines(keepends=True)[:LINES]
    (logs / "chat.jsonl").write_text("".join(head))
    spec = write_spec(specs, "ep1", [logs / "chat.jsonl"])
    defs = build_defs(out_dir=str(tmp_path / "out"), spec_dir=str(specs), candidates_dir=str(tmp_path / "candidates"),
                      settings=SMALL, campaign=CampaignResource(budget_experiments=1, search_trials=0,
                                                                concurrent_gpus=1))
    resources = {"registry": EndpointRegistry(spec_dir=str(specs), candidates_dir=str(tmp_path / "candidates")),
                 "engines": EngineFactory()}
    seen = engine_version_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    instance.add_dynamic_partitions("endpoints", ["ep1"])
    # a tiny campaign, measured, diagnosed and reported: it has ended
    assert execute(defs, instance, "ep1", [dg.AssetKey(k) for k in KEYS], checks=[]).success
    assert execute(defs, instance, "ep1", [dg.AssetKey("campaign_report")]).success  # the campaign sensor's run
    ended = _state(tmp_path)
    assert ended["status"] == "ended"
    (old,) = _noise(instance)
    old_version = old["engine_version"].value
    assert not old_version.endswith("+r2")

    # the operator upgrades the engine (the emulator's release label): the sensor requests the re-measure
    spec.write_text(spec.read_text().replace("{hidden_factors_seed: 7}", "{hidden_factors_seed: 7, release: r2}"))
    tick = engine_version_sensor(dg.build_sensor_context(instance=instance, resources=resources, cursor=seen.cursor))
    (req,) = tick.run_requests
    assert req.partition_key == "ep1" and req.tags["autoresearch/reason"] == "engine version bump"
    run = execute(defs, instance, req.partition_key, list(req.asset_selection), tags=req.tags)
    assert run.success

    state = _state(tmp_path)
    new_version = state["engine_version"]
    assert new_version == f"{old_version}+r2" and state["status"] == "running"
    assert state["campaign_id"] != ended["campaign_id"]  # a new campaign, its id naming the new version
    assert state["previous"]["campaign_id"] == ended["campaign_id"] and state["previous"]["why"].startswith(
        "engine_bump")
    # its own noise floor, measured on the new version: a new noise id, runs of the new version only
    _, new = _noise(instance)
    assert new["engine_version"].value == new_version and new["era"].value == 0
    era = state["eras"][0]
    assert era["engine_version"] == new_version and era["noise"]["engine_version"] == new_version
    assert era["noise"]["noise_id"] != ended["eras"][0]["noise"]["noise_id"]
    # re-diagnosed in the same run, on the new campaign's baseline
    assert era["hypotheses"] and Path(era["report_path"]).is_relative_to(tmp_path / "out" / "ep1" / "campaign" / "eras")
    control = json.loads((tmp_path / "out" / "ep1" / "campaign" / "eras" / "00" / "control_runs.json").read_text())
    runs = control["runs"] if isinstance(control, dict) else control
    assert len(runs) == new["runs"].value and {r["engine_version"] for r in runs} == {new_version}
    # the ended campaign is archived with its own control; the lake holds both campaigns, each with its version
    assert list((tmp_path / "out" / "ep1" / "campaign" / "archive").glob(f"{ended['campaign_id']}.*/state.json"))
    lake = ResultsLake(tmp_path / "out" / "lake")
    rows = dict(lake.query("SELECT campaign_id, engine_version FROM campaigns WHERE endpoint = 'ep1'"))
    assert rows == {ended["campaign_id"]: old_version, state["campaign_id"]: new_version}
    noise_rows = lake.query("SELECT DISTINCT engine_version FROM runs WHERE endpoint = 'ep1' AND campaign_id = "
                            f"'{state['campaign_id']}'")
    assert noise_rows == [(new_version,)]
