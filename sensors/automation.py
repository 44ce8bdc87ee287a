"""Owns the automation sensor: evaluates every asset's automation condition, running by default."""
import dagster as dg

from sensors.interval import interval

# AssetSelection.all() omits source assets; without naming engine_version here it would fall to
# Dagster's auto-created default sensor, which starts STOPPED.
loop_automation = dg.AutomationConditionSensorDefinition(
    "loop_automation",
    target=dg.AssetSelection.all() | dg.AssetSelection.assets("engine_version"),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=interval(30),
)
