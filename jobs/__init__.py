"""Dagster layer: the project's instance and in-process runs (instance), the main job's driver (main_job)."""
