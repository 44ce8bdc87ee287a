"""Dagster sensors: endpoint discovery, engine version bumps, promotion (the loop's back edge), new logs,
automation, orphaned runs."""
from sensors.automation import loop_automation
from sensors.campaign import campaign_sensor
from sensors.discovery import endpoint_discovery_sensor
from sensors.engine import engine_version_sensor
from sensors.logs import new_logs_sensor
from sensors.orphans import orphaned_run_sensor
from sensors.promotion import promotion_sensor

__all__ = ["campaign_sensor", "endpoint_discovery_sensor", "engine_version_sensor", "loop_automation", "new_logs_sensor",
           "orphaned_run_sensor", "promotion_sensor"]
