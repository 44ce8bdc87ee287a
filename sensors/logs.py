"""Owns the new-logs sensor: a changed set of log files for an endpoint requests a pool rebuild."""

import json

import dagster as dg

from assets.partitions import endpoints
from resources import EndpointRegistry
from sensors.interval import interval


@dg.sensor(target=[dg.AssetKey("replay_pool")], minimum_interval_seconds=interval(60),
           default_status=dg.DefaultSensorStatus.RUNNING)
def new_logs_sensor(context: dg.SensorEvaluationContext, registry: EndpointRegistry):
    """Request a replay_pool rebuild for an endpoint whose log files changed since the last tick.
    The first sighting of an endpoint only records its files: discovery builds its first pool."""
    from autoresearch_dagster.pool.sources import fingerprint_digest, log_fingerprint

    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    requests = []
    current: dict[str, str] = {}
    for name in registry.names():
        sig = fingerprint_digest(log_fingerprint(registry.log_files(name)))
        current[name] = sig
        if name in seen and seen[name] != sig and context.instance.has_dynamic_partition(endpoints.name, name):
            requests.append(dg.RunRequest(run_key=f"logs:{name}:{sig}", partition_key=name,
                                          asset_selection=[dg.AssetKey("replay_pool")],
                                          tags={"autoresearch/endpoint": name, "autoresearch/logs": sig}))
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(current, sort_keys=True))
