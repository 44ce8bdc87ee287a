"""Owns the run config of confirmed_baseline, the run tag the promotion back-edge uses and the name of
the GPU concurrency pool."""
import dagster as dg

PROMOTED_FROM_TAG = "autoresearch/promoted_from_run"
# Every step that runs load on an engine takes one slot of this pool; the instance config sizes it to the GPUs.
GPU_POOL = "gpu"


class BaselineConfig(dg.Config):
    """Which server config becomes the working baseline; empty means the endpoint spec's own config."""

    candidate_id: str = "initial"
    server_config_json: str = ""
    experiment_id: str = ""
