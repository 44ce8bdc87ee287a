"""Owns the one Dagster ``Definitions`` of the project (the only core module that imports dagster).

Loaded by ``dagster dev -w workspace.yaml``; also builds the instance and drives the main job
(``run_main_job``) that ``autoresearch run`` calls: real Dagster runs against a persistent
instance at DAGSTER_HOME, so the UI later shows every run and the lineage.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import dagster as dg

# Known and accepted: observable_source_asset is beta, partitioned asset checks are preview.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

from assets.inputs import engine_version  # noqa: E402
from assets.loop import (  # noqa: E402
    confirmed_baseline,
    diagnostic_report,
    experiment_results,
    noise_baseline,
    promotion_decision,
    proposals,
)
from assets.pool import replay_fidelity, replay_pool  # noqa: E402
from resources import (  # noqa: E402
    ArtifactStore,
    EndpointRegistry,
    EngineFactory,
    MeasurementSettings,
    MemoryStore,
    PoolSettings,
    ResultsLakeResource,
)
from sensors import endpoint_discovery_sensor, loop_automation, new_logs_sensor, promotion_sensor  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
OBSERVE_ENGINE_JOB = "observe_engine_version"
ASSETS = [engine_version, replay_pool, confirmed_baseline, noise_baseline, diagnostic_report, proposals,
          experiment_results, promotion_decision]


def _path(env: str, default: str) -> str:
    p = Path(os.environ.get(env, default))
    return str(p if p.is_absolute() else PROJECT_ROOT / p)


def build_defs(*, out_dir: str | None = None, spec_dir: str | None = None, candidates_dir: str | None = None,
               settings: MeasurementSettings | None = None) -> dg.Definitions:
    """The project's Definitions; arguments override the AUTORESEARCH_* environment defaults."""
    out = out_dir or _path("AUTORESEARCH_OUT", "out")
    if settings is None:
        settings = (MeasurementSettings.quick() if os.environ.get("AUTORESEARCH_MEASURE", "standard") == "quick"
                    else MeasurementSettings())
    engines = (EngineFactory(api_key=dg.EnvVar("AUTORESEARCH_API_KEY")) if "AUTORESEARCH_API_KEY" in os.environ
               else EngineFactory())
    pool_settings = PoolSettings(
        redaction_key=dg.EnvVar("AUTORESEARCH_REDACTION_KEY") if "AUTORESEARCH_REDACTION_KEY" in os.environ else None,
        tokenizer_path=os.environ.get("AUTORESEARCH_TOKENIZER"))
    return dg.Definitions(
        assets=ASSETS,
        asset_checks=[replay_fidelity],
        # the automation sensor observes engine_version on its cron; this job does it on demand
        jobs=[dg.define_asset_job(OBSERVE_ENGINE_JOB, selection=dg.AssetSelection.assets("engine_version"))],
        sensors=[endpoint_discovery_sensor, promotion_sensor, new_logs_sensor, loop_automation],
        resources={
            "registry": EndpointRegistry(
                spec_dir=spec_dir or _path("AUTORESEARCH_ENDPOINTS", "examples/endpoints"),
                candidates_dir=candidates_dir or _path("AUTORESEARCH_CANDIDATES", "examples/candidates")),
            "engines": engines,
            "settings": settings,
            "pool_settings": pool_settings,
            "store": ArtifactStore(out_dir=out),
            "lake": ResultsLakeResource(root=str(Path(out) / "lake")),
            "memory": MemoryStore(path=str(Path(out) / "memory")),
        },
    )


defs = build_defs()


STORAGE_TEMPLATES = PROJECT_ROOT / "dagster_home"


def prepare_dagster_home(home: str | Path | None = None, storage: str | None = None) -> Path:
    """Render ``$DAGSTER_HOME/dagster.yaml`` from ``dagster_home/<storage>/dagster.yaml``.

    ``storage`` defaults to AUTORESEARCH_DAGSTER_STORAGE, else ``sqlite``; DAGSTER_HOME defaults to
    the project-local ``.dagster_home``. dagster.yaml has no conditionals and an unset ``{env: X}``
    fails at load, so the optional Postgres password line is dropped when DAGSTER_PG_PASSWORD is unset.
    """
    home = Path(home or os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home").resolve()
    storage = storage or os.environ.get("AUTORESEARCH_DAGSTER_STORAGE", "sqlite")
    template = STORAGE_TEMPLATES / storage / "dagster.yaml"
    if not template.exists():
        raise ValueError(f"unknown instance storage {storage!r}; choose one of: "
                         f"{', '.join(sorted(p.name for p in STORAGE_TEMPLATES.iterdir() if p.is_dir()))}")
    text = template.read_text()
    if storage == "postgres":
        missing = [v for v in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USERNAME", "DAGSTER_PG_DB")
                   if not os.environ.get(v)]
        if missing:
            raise ValueError(f"Postgres instance storage needs {', '.join(missing)} "
                             "(eval \"$(bash scripts/pg.sh start)\" starts a throwaway cluster)")
        if "DAGSTER_PG_PASSWORD" not in os.environ:
            text = "\n".join(line for line in text.splitlines() if "DAGSTER_PG_PASSWORD}" not in line) + "\n"
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    tmp = home / ".dagster.yaml.tmp"
    tmp.write_text(text)
    os.replace(tmp, target)
    return home


def instance(home: str | Path | None = None, storage: str | None = None) -> dg.DagsterInstance:
    """A persistent instance at the rendered DAGSTER_HOME (what `dagster dev` will show)."""
    return dg.DagsterInstance.from_config(str(prepare_dagster_home(home, storage)))


def execute(defs: dg.Definitions, instance: dg.DagsterInstance, partition: str, assets: list[dg.AssetKey], *,
            checks: list[dg.AssetCheckKey] | None = None, run_config: dict | None = None,
            tags: dict[str, str] | None = None, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """One real run of the project's asset job for one endpoint partition: the selected assets with
    their checks (or exactly ``checks`` when given), recorded in ``instance``."""
    job = defs.resolve_implicit_global_asset_job_def()
    if checks is not None:
        job = job.get_subset(asset_selection=set(assets), asset_check_selection=set(checks))
        assets = None
    return job.execute_in_process(instance=instance, partition_key=partition, asset_selection=assets,
                                  run_config=run_config, tags=tags, raise_on_error=raise_on_error)


def observe_engine_version(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """One observation run of the engine_version source asset."""
    return defs.resolve_job_def(OBSERVE_ENGINE_JOB).execute_in_process(instance=instance)
