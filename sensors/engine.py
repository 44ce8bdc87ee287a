"""Owns the engine-version sensor: a version bump re-measures the working baseline and re-diagnoses it.

Each tick asks every discovered endpoint's engine which version it reports (the emulator's build and
release, the ``/server_info`` of a running server, the installed SGLang), records the versions as an
observation of the ``engine_version`` source asset (so nothing below it waits for the asset's cron),
and, for an endpoint whose version changed since the cursor, requests noise_baseline and
diagnostic_report tagged with why (the automation sensor then runs the round below them). The first
sighting of an endpoint only records its version: discovery starts its campaign. Earlier findings
stay in the lake, each row with the engine version it was measured on.
"""
import json

import dagster as dg

from assets.partitions import endpoints
from assets.inputs import endpoint_versions, joined
from resources import EndpointRegistry, EngineFactory
from sensors.interval import interval

ENGINE = dg.AssetKey("engine_version")
REMEASURE = [dg.AssetKey("noise_baseline"), dg.AssetKey("diagnostic_report")]
REASON_TAG = "autoresearch/reason"
VERSION_TAG = "autoresearch/engine_version"


@dg.sensor(target=REMEASURE, minimum_interval_seconds=interval(60), default_status=dg.DefaultSensorStatus.RUNNING)
def engine_version_sensor(context: dg.SensorEvaluationContext, registry: EndpointRegistry, engines: EngineFactory):
    """Observe every endpoint's engine version; a changed one re-measures and re-diagnoses that endpoint."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    versions = endpoint_versions(registry, engines)
    requests = []
    for name, version in sorted(versions.items()):
        old = seen.get(name)
        if old is None or old == version or "unavailable" in version:
            continue
        if not context.instance.has_dynamic_partition(endpoints.name, name):
            continue
        requests.append(dg.RunRequest(
            run_key=f"engine:{name}:{version}", partition_key=name, asset_selection=REMEASURE,
            tags={"autoresearch/endpoint": name, REASON_TAG: "engine version bump",
                  VERSION_TAG: f"{old} -> {version}"[:255]}))
    # an unavailable engine keeps its last known version, so its return is not read as a bump
    cursor = {**seen, **{k: v for k, v in versions.items() if "unavailable" not in v or k not in seen}}
    events = []
    if versions and (joined(cursor) != joined(seen) or not context.cursor):
        events.append(dg.AssetObservation(asset_key=ENGINE, tags={"dagster/data_version": joined(versions)},
                                          metadata={"versions": dg.MetadataValue.json(versions),
                                                    "observed_by": "engine_version_sensor"}))
    return dg.SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor, sort_keys=True))
