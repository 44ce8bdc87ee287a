"""Dagster assets and checks of the loop: thin wrappers that call the core and attach metadata."""
