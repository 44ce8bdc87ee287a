"""Owns the run config of confirmed_baseline and the run tag the promotion back-edge uses."""
import dagster as dg

PROMOTED_FROM_TAG = "autoresearch/promoted_from_run"


class BaselineConfig(dg.Config):
    """Which server config becomes the working baseline; empty means the endpoint spec's own config."""

    candidate_id: str = "initial"
    server_config_json: str = ""
    experiment_id: str = ""
