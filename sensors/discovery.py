"""Owns endpoint discovery: a sensor that adds a partition per new endpoint spec and requests its first runs."""

import dagster as dg

from assets.partitions import endpoints
from resources import EndpointRegistry
from sensors.interval import interval

FIRST_RUN_ASSETS = [dg.AssetKey("replay_pool"), dg.AssetKey("confirmed_baseline")]


@dg.sensor(minimum_interval_seconds=interval(60), default_status=dg.DefaultSensorStatus.RUNNING,
           target=[dg.AssetKey("replay_pool"), dg.AssetKey("confirmed_baseline")])
def endpoint_discovery_sensor(context: dg.SensorEvaluationContext, registry: EndpointRegistry):
    """Add a partition for every endpoint spec file without one and build its pool and baseline in
    the same result: automation ignores partitions that existed before its first evaluation."""
    new = [n for n in registry.names() if not context.instance.has_dynamic_partition(endpoints.name, n)]
    if not new:
        return dg.SkipReason(f"no new endpoint specs in {registry.spec_dir}")
    return dg.SensorResult(
        dynamic_partitions_requests=[endpoints.build_add_request(new)],
        run_requests=[dg.RunRequest(run_key=f"discover:{n}", partition_key=n, asset_selection=FIRST_RUN_ASSETS,
                                    tags={"autoresearch/endpoint": n}) for n in new],
    )
