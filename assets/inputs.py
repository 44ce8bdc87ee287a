"""Owns the engine_version observable source: the serving engine's reported version, polled on a cron."""

import dagster as dg

from resources import EndpointRegistry, EngineFactory


@dg.observable_source_asset(
    name="engine_version",
    group_name="inputs",
    automation_condition=dg.AutomationCondition.cron_tick_passed("*/10 * * * *").since_last_handled(),
)
def engine_version(registry: EndpointRegistry, engines: EngineFactory) -> dg.ObserveResult:
    """The version each endpoint's engine reports (emulator build, SGLang release). A new version
    re-measures the noise floor and re-runs diagnosis; re-observing the same version does nothing."""
    from autoresearch_dagster.engines.base import EngineError
    from autoresearch_dagster.spec import SpecError

    versions = {}
    for spec in registry.specs():
        try:
            versions[spec.name] = f"{spec.engine}:{engines.version(spec)}"
        except (EngineError, SpecError) as e:  # one endpoint's missing engine must not hide the others'
            versions[spec.name] = f"{spec.engine}:unavailable ({e})"
    joined = ";".join(f"{k}={v}" for k, v in sorted(versions.items()))
    return dg.ObserveResult(data_version=dg.DataVersion(joined), metadata={"versions": dg.MetadataValue.json(versions)})
