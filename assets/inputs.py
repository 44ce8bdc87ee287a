"""Owns the engine_version observable source: the serving engine's reported version, polled on a cron
(and on every tick of the engine_version sensor, which re-measures an endpoint whose version changed)."""

import dagster as dg

from resources import EndpointRegistry, EngineFactory


def endpoint_versions(registry: EndpointRegistry, engines: EngineFactory) -> dict[str, str]:
    """``{endpoint: "engine:version"}`` as the engine_version asset reports them (an engine that cannot
    answer reads ``engine:unavailable (why)``, so one endpoint's missing engine does not hide the others)."""
    from autoresearch_dagster.engines.base import EngineError
    from autoresearch_dagster.spec import SpecError

    versions = {}
    for spec in registry.specs():
        try:
            versions[spec.name] = f"{spec.engine}:{engines.version(spec)}"
        except (EngineError, SpecError) as e:
            versions[spec.name] = f"{spec.engine}:unavailable ({e})"
    return versions


def joined(versions: dict[str, str]) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(versions.items()))


@dg.observable_source_asset(
    name="engine_version",
    group_name="inputs",
    automation_condition=dg.AutomationCondition.cron_tick_passed("*/10 * * * *").since_last_handled(),
)
def engine_version(registry: EndpointRegistry, engines: EngineFactory) -> dg.ObserveResult:
    """The version each endpoint's engine reports (emulator build, SGLang release). A new version
    re-measures the noise floor and re-runs diagnosis; re-observing the same version does nothing."""
    versions = endpoint_versions(registry, engines)
    return dg.ObserveResult(data_version=dg.DataVersion(joined(versions)),
                            metadata={"versions": dg.MetadataValue.json(versions)})
