"""Owns the one partitioning of the loop: endpoints, as dynamic partitions added by discovery."""
import dagster as dg

endpoints = dg.DynamicPartitionsDefinition(name="endpoints")

# Eager alone still fires after a blocking check failed in an earlier run (dagster #17332).
EAGER = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()
