"""Owns the one Dagster ``Definitions`` of the project (the only core module that imports dagster).

Loaded by ``dagster dev -w workspace.yaml`` and by the main-job driver in ``jobs/``, which runs it in
process. It only assembles: assets, checks, the observation job, sensors, resources.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import dagster as dg

# Known and accepted: observable_source_asset is beta, partitioned asset checks are preview.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

from assets.approval import approve_production, production_approval  # noqa: E402
from assets.emulator import emulator_error_report  # noqa: E402
from assets.inputs import engine_version  # noqa: E402
from assets.loop import (  # noqa: E402
    campaign_report,
    confirmed_baseline,
    correctness_gate,
    diagnostic_report,
    experiment_results,
    noise_baseline,
    promotion_decision,
    proposals,
    replay_vs_production,
)
from assets.pool import replay_fidelity, replay_pool  # noqa: E402
from assets.remote import remote_measurement  # noqa: E402
from resources import (  # noqa: E402
    ArtifactStore,
    CampaignResource,
    EndpointRegistry,
    EngineFactory,
    MeasurementSettings,
    MemoryStore,
    PoolSettings,
    ResultsLakeResource,
)
from sensors import (  # noqa: E402
    campaign_sensor,
    endpoint_discovery_sensor,
    engine_version_sensor,
    loop_automation,
    new_logs_sensor,
    orphaned_run_sensor,
    promotion_sensor,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
OBSERVE_ENGINE_JOB = "observe_engine_version"
ASSETS = [engine_version, replay_pool, confirmed_baseline, noise_baseline, diagnostic_report, proposals,
          experiment_results, promotion_decision, campaign_report, production_approval, emulator_error_report,
          remote_measurement]


def _path(env: str, default: str) -> str:
    p = Path(os.environ.get(env, default))
    return str(p if p.is_absolute() else PROJECT_ROOT / p)


def _json_env(env: str) -> dict:
    """A JSON object of resource fields from the environment (AUTORESEARCH_MEASURE_JSON, AUTORESEARCH_CAMPAIGN_JSON):
    how a deployment the daemon loads (``autoresearch serve``) sets what ``make run`` passes as arguments."""
    import json

    raw = os.environ.get(env)
    if not raw:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"{env} must be a JSON object of resource fields, got {raw!r}")
    return value


def build_defs(*, out_dir: str | None = None, spec_dir: str | None = None, candidates_dir: str | None = None,
               settings: MeasurementSettings | None = None, campaign: CampaignResource | None = None,
               memory_dir: str | None = None) -> dg.Definitions:
    """The project's Definitions; arguments override the AUTORESEARCH_* environment defaults."""
    out = out_dir or _path("AUTORESEARCH_OUT", "out")
    if settings is None:
        settings = MeasurementSettings(**{"profile": os.environ.get("AUTORESEARCH_MEASURE", "standard"),
                                          **_json_env("AUTORESEARCH_MEASURE_JSON")})
    engines = (EngineFactory(api_key=dg.EnvVar("AUTORESEARCH_API_KEY")) if "AUTORESEARCH_API_KEY" in os.environ
               else EngineFactory())
    pool_settings = PoolSettings(
        redaction_key=dg.EnvVar("AUTORESEARCH_REDACTION_KEY") if "AUTORESEARCH_REDACTION_KEY" in os.environ else None,
        tokenizer_path=os.environ.get("AUTORESEARCH_TOKENIZER"))
    return dg.Definitions(
        assets=ASSETS,
        asset_checks=[replay_fidelity, replay_vs_production, correctness_gate],
        # the automation sensor observes engine_version on its cron; this job does it on demand
        jobs=[dg.define_asset_job(OBSERVE_ENGINE_JOB, selection=dg.AssetSelection.assets("engine_version")),
              approve_production],
        sensors=[endpoint_discovery_sensor, engine_version_sensor, promotion_sensor, campaign_sensor, new_logs_sensor, loop_automation,
                 orphaned_run_sensor],
        resources={
            "registry": EndpointRegistry(
                spec_dir=spec_dir or _path("AUTORESEARCH_ENDPOINTS", "examples/endpoints"),
                candidates_dir=candidates_dir or _path("AUTORESEARCH_CANDIDATES", "examples/candidates")),
            "engines": engines,
            "pipes_subprocess_client": dg.PipesSubprocessClient(),
            "settings": settings,
            "pool_settings": pool_settings,
            "store": ArtifactStore(out_dir=out),
            "lake": ResultsLakeResource(root=str(Path(out) / "lake")),
            "memory": MemoryStore(path=memory_dir or _path("AUTORESEARCH_MEMORY", str(Path(out) / "memory"))),
            "campaign": campaign or CampaignResource(**{
                "proposer": os.environ.get("AUTORESEARCH_PROPOSER", "offline"),
                "budget_experiments": int(os.environ.get("AUTORESEARCH_BUDGET_EXPERIMENTS", "12")),
                **_json_env("AUTORESEARCH_CAMPAIGN_JSON")}),
        },
    )


defs = build_defs()
