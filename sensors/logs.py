"""Owns the new-logs sensor: a changed set of log files for an endpoint requests a pool rebuild."""

import hashlib
import json

import dagster as dg

from assets.partitions import endpoints
from resources import EndpointRegistry


def logs_signature(registry: EndpointRegistry, name: str) -> str:
    """Digest of the endpoint's log files (path, size, mtime): any new, grown or replaced file changes it."""
    h = hashlib.sha256()
    for p in registry.log_files(name):
        st = p.stat() if p.exists() else None
        h.update(f"{p}|{st.st_size if st else -1}|{st.st_mtime_ns if st else -1}\n".encode())
    return h.hexdigest()[:16]


@dg.sensor(target=[dg.AssetKey("replay_pool")], minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.RUNNING)
def new_logs_sensor(context: dg.SensorEvaluationContext, registry: EndpointRegistry):
    """Request a replay_pool rebuild for an endpoint whose log files changed since the last tick.
    The first sighting of an endpoint only records its files: discovery builds its first pool."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    requests = []
    current: dict[str, str] = {}
    for name in registry.names():
        sig = logs_signature(registry, name)
        current[name] = sig
        if name in seen and seen[name] != sig and context.instance.has_dynamic_partition(endpoints.name, name):
            requests.append(dg.RunRequest(run_key=f"logs:{name}:{sig}", partition_key=name,
                                          asset_selection=[dg.AssetKey("replay_pool")],
                                          tags={"autoresearch/endpoint": name, "autoresearch/logs": sig}))
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(current, sort_keys=True))
