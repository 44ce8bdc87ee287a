"""Owns ``remote_measurement``: one measurement of the working baseline's config run outside the Dagster
process through Pipes (``jobs/modal_pipes.py``), on Modal's GPUs for an ``engine: modal`` endpoint with
credentials, else locally on the embedded emulator; its logs, metadata and ``valid_run`` check come back
into the run. Materialized on demand (no automation condition): an operator's check that the remote
runner measures what the loop measures."""
import os
import sys
from pathlib import Path

import dagster as dg

from assets.config import GPU_POOL
from assets.loop import POOL, confirmed_baseline
from assets.partitions import endpoints
from resources import ArtifactStore, EndpointRegistry, ResultsLakeResource

PIPES_SCRIPT = Path(__file__).resolve().parents[1] / "jobs" / "modal_pipes.py"


class RemoteMeasurementConfig(dg.Config):
    where: str = "auto"  # auto | modal | local (auto: Modal for an `engine: modal` endpoint with credentials)
    image: str = ""  # the container image (default: engine_options.image, else the SGLang release image)
    profile: str = "standard"  # the measurement profile of the run
    seed: int = 0


def modal_configured() -> bool:
    return bool(os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")) or \
        (Path.home() / ".modal.toml").exists()


def choose_where(requested: str, engine: str, configured: bool) -> str:
    if requested not in ("auto", "modal", "local"):
        raise dg.Failure(f"where must be auto, modal or local, not {requested!r}")
    if requested == "modal" and not configured:
        raise dg.Failure("where=modal needs Modal credentials (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET or ~/.modal.toml)")
    if requested == "auto":
        return "modal" if engine == "modal" and configured else "local"
    return requested


@dg.asset(partitions_def=endpoints, group_name="remote", kinds={"modal", "python"}, deps=[confirmed_baseline, POOL],
          pool=GPU_POOL, check_specs=[dg.AssetCheckSpec("valid_run", asset="remote_measurement")])
def remote_measurement(context: dg.AssetExecutionContext, config: RemoteMeasurementConfig,
                       pipes_subprocess_client: dg.PipesSubprocessClient, registry: EndpointRegistry,
                       store: ArtifactStore, lake: ResultsLakeResource):
    from autoresearch_dagster.engines.modal_app import DEFAULT_IMAGE, measurement_request

    name = context.partition_key
    spec = registry.load(name)
    where = choose_where(config.where, spec.engine, modal_configured())
    server_config = store.read_json(name, "confirmed_baseline", "baseline.json")["server_config"]
    pool = lake.lake().pool_dir(name) / "replay_pool.parquet"
    if not pool.exists():
        raise dg.Failure(f"no replay pool for {name} at {pool}: materialize replay_pool first")
    engine = "sglang" if where == "modal" or spec.engine == "sglang" else "emulator"
    request = measurement_request(spec, server_config, pool, seed=config.seed, profile=config.profile, engine=engine)
    image = config.image or str(spec.engine_options.get("image") or DEFAULT_IMAGE)
    return pipes_subprocess_client.run(
        command=[sys.executable, str(PIPES_SCRIPT)], context=context,
        extras={"request": request, "where": where, "image": image, "app_name": "autoresearch-measure"},
        env={"PYTHONPATH": os.pathsep.join(p for p in (str(PIPES_SCRIPT.parents[1]), os.environ.get("PYTHONPATH", ""))
                                           if p)},
    ).get_results()
