"""Sensors evaluated with build_sensor_context against a real instance and real cursors."""
import json
import os

import dagster as dg

from assets.config import PROMOTED_FROM_TAG
from .conftest import write_spec
from resources import EndpointRegistry, EngineFactory
from sensors import (campaign_sensor, endpoint_discovery_sensor, engine_version_sensor, new_logs_sensor,
                     promotion_sensor)


def _registry(project):
    return EndpointRegistry(spec_dir=str(project / "endpoints"), candidates_dir=str(project / "candidates"))


def test_discovery_adds_partitions_and_requests_first_runs(project, instance):
    reg = _registry(project)
    ctx = dg.build_sensor_context(instance=instance, resources={"registry": reg})
    result = endpoint_discovery_sensor(ctx)
    assert result.dynamic_partitions_requests[0].partition_keys == ["ep1"]
    (req,) = result.run_requests
    assert req.partition_key == "ep1"
    assert set(req.asset_selection) == {dg.AssetKey("replay_pool"), dg.AssetKey("confirmed_baseline")}

    instance.add_dynamic_partitions("endpoints", ["ep1"])
    assert isinstance(endpoint_discovery_sensor(ctx), dg.SkipReason)

    write_spec(project / "endpoints", "ep2", [project / "logs" / "chat.jsonl"])
    again = endpoint_discovery_sensor(ctx)
    assert again.dynamic_partitions_requests[0].partition_keys == ["ep2"]
    assert [r.partition_key for r in again.run_requests] == ["ep2"]


def _decision(instance, partition, *, promote, candidate="cand", config=None, run_id=None, next_="continue"):
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key="promotion_decision", partition=partition,
        metadata={"promote": promote, "candidate_id": candidate, "next": next_,
                  "server_config_json": json.dumps(config or {"schedule_policy": "lpm"})}))


def test_campaign_sensor_requests_the_next_round_or_the_report_never_a_promotion(instance):
    instance.add_dynamic_partitions("endpoints", ["e1", "e2", "e3"])
    first = campaign_sensor(dg.build_sensor_context(instance=instance))
    _decision(instance, "e1", promote=False)  # another round on the same baseline
    _decision(instance, "e2", promote=True)  # the promotion sensor's edge, not this one
    _decision(instance, "e3", promote=False, next_="end")
    result = campaign_sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
    by_part = {r.partition_key: r for r in result.run_requests}
    assert set(by_part) == {"e1", "e3"}
    assert {k.to_user_string() for k in by_part["e1"].asset_selection} == {"proposals", "experiment_results",
                                                                             "promotion_decision"}
    assert [k.to_user_string() for k in by_part["e3"].asset_selection] == ["campaign_report"]
    again = campaign_sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor))
    assert again.run_requests == []
    replay = campaign_sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
    assert sorted(r.run_key for r in replay.run_requests) == sorted(r.run_key for r in result.run_requests)


def test_promotion_sensor_sees_every_endpoint_promoted_between_ticks(instance):
    instance.add_dynamic_partitions("endpoints", ["e1", "e2", "e3"])
    ctx = dg.build_sensor_context(instance=instance)
    first = promotion_sensor(ctx)
    assert first.run_requests == [] and first.cursor is None

    _decision(instance, "e1", promote=True, candidate="c1")
    _decision(instance, "e2", promote=True, candidate="c2", config={"chunked_prefill_size": 4096})
    _decision(instance, "e3", promote=False)
    result = promotion_sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
    by_part = {r.partition_key: r for r in result.run_requests}
    assert set(by_part) == {"e1", "e2"}  # an @asset_sensor would have seen only the latest (e3)
    cfg = by_part["e2"].run_config["ops"]["confirmed_baseline"]["config"]
    assert cfg["candidate_id"] == "c2" and json.loads(cfg["server_config_json"]) == {"chunked_prefill_size": 4096}
    assert by_part["e1"].tags[PROMOTED_FROM_TAG]
    assert by_part["e1"].run_key != by_part["e2"].run_key

    # the cursor moved past all three decisions: the next tick requests nothing
    after = promotion_sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor))
    assert after.run_requests == [] and after.cursor == result.cursor
    # same decisions re-read from a reset cursor give the same idempotent run keys
    replay = promotion_sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
    assert sorted(r.run_key for r in replay.run_requests) == sorted(r.run_key for r in result.run_requests)


def test_logs_sensor_requests_a_rebuild_when_logs_change(project, instance):
    reg = _registry(project)
    instance.add_dynamic_partitions("endpoints", ["ep1"])
    first = new_logs_sensor(dg.build_sensor_context(instance=instance, resources={"registry": reg}))
    assert first.run_requests == []  # first sighting only records the files
    same = new_logs_sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor,
                                                   resources={"registry": reg}))
    assert same.run_requests == []

    log = project / "logs" / "chat.jsonl"
    with log.open("a") as f:
        f.write(log.read_text().splitlines()[0] + "\n")
    os.utime(log, ns=(log.stat().st_atime_ns, log.stat().st_mtime_ns + 10**9))
    changed = new_logs_sensor(dg.build_sensor_context(instance=instance, cursor=same.cursor,
                                                      resources={"registry": reg}))
    (req,) = changed.run_requests
    assert req.partition_key == "ep1" and req.asset_selection == [dg.AssetKey("replay_pool")]
    assert changed.cursor != same.cursor


def test_engine_version_sensor_observes_versions_and_remeasures_an_endpoint_whose_version_changed(project, instance):
    resources = {"registry": _registry(project), "engines": EngineFactory()}
    spec = project / "endpoints" / "ep1.yaml"
    first = engine_version_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    assert first.run_requests == []  # the first sighting only records the version (discovery starts the campaign)
    (obs,) = first.asset_events
    assert obs.asset_key == dg.AssetKey("engine_version") and "ep1=emulator:emulator-" in obs.tags["dagster/data_version"]
    same = engine_version_sensor(dg.build_sensor_context(instance=instance, resources=resources, cursor=first.cursor))
    assert same.run_requests == [] and same.asset_events == []

    spec.write_text(spec.read_text().replace("{hidden_factors_seed: 7}", "{hidden_factors_seed: 7, release: r2}"))
    unknown = engine_version_sensor(dg.build_sensor_context(instance=instance, resources=resources, cursor=first.cursor))
    assert unknown.run_requests == []  # no partition yet: nothing to re-measure
    instance.add_dynamic_partitions("endpoints", ["ep1"])
    bump = engine_version_sensor(dg.build_sensor_context(instance=instance, resources=resources, cursor=first.cursor))
    (req,) = bump.run_requests
    assert req.partition_key == "ep1" and req.tags["autoresearch/reason"] == "engine version bump"
    assert req.tags["autoresearch/engine_version"].endswith("+r2")
    assert {k.to_user_string() for k in req.asset_selection} == {"noise_baseline", "diagnostic_report"}
    assert bump.asset_events[0].tags["dagster/data_version"].endswith("+r2")
    after = engine_version_sensor(dg.build_sensor_context(instance=instance, resources=resources, cursor=bump.cursor))
    assert after.run_requests == [] and after.asset_events == []
