"""Owns the engine factory and measurement-settings resources (which engine, how long to measure)."""

from typing import Any

import dagster as dg
from pydantic import model_validator

from autoresearch_dagster.spec import EndpointSpec


class EngineFactory(dg.ConfigurableResource):
    """Builds the Engine an endpoint names (emulator by default). ``api_key`` comes from dg.EnvVar only."""

    emulator_mode: str = "virtual"
    api_key: str | None = None

    def make(self, endpoint: EndpointSpec) -> Any:
        from autoresearch_dagster.engines import make_engine

        return make_engine(endpoint, mode=self.emulator_mode, api_key=self.api_key)

    def version(self, endpoint: EndpointSpec) -> str:
        return self.make(endpoint).version()


class MeasurementSettings(dg.ConfigurableResource):
    """How much measuring each run and round does: a named profile (``measure.profiles``: standard,
    quick = ``make run``'s, short) with any field overridden; unset fields take the profile's values."""

    profile: str = "standard"
    step_duration_s: float | None = None
    min_completed: int | None = None
    warmup_s: float | None = None
    start_rps: float | None = None
    growth: float | None = None
    resolution: float | None = None
    max_steps: int | None = None
    request_timeout_s: float | None = None
    hold_e2e_multiple: float | None = None  # > 0: steps held >= 1.25 x this many mean E2E (see docs/runner.md)
    noise_runs: int | None = None
    initial_runs_per_arm: int | None = None
    max_runs_per_arm: int | None = None
    experiments_per_round: int | None = None
    quick_diagnosis: bool | None = None
    diagnosis_probes: bool = True
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _from_profile(cls, data: Any) -> Any:
        """Fill every unset field from the named profile, so assets read plain values."""
        if not isinstance(data, dict):
            return data
        from autoresearch_dagster.measure.profiles import measurement_profile

        flat = measurement_profile(data.get("profile") or "standard").flat()
        names = set(cls.model_fields)
        return {**{k: v for k, v in flat.items() if k in names}, **{k: v for k, v in data.items() if v is not None}}

    def measurement_profile(self) -> Any:
        """The profile with this resource's values (a ``measure.profiles.MeasurementProfile``)."""
        from autoresearch_dagster.measure.profiles import measurement_profile

        values = {k: getattr(self, k) for k in type(self).model_fields if k not in ("profile", "diagnosis_probes",
                                                                                   "seed")}
        return measurement_profile(self.profile).with_overrides(**values)

    def capacity(self) -> Any:
        return self.measurement_profile().capacity

    def harness(self) -> Any:
        from autoresearch_dagster.experiments.runs import HarnessSettings

        return HarnessSettings(capacity=self.capacity(), seed=self.seed)

    def budget(self) -> Any:
        from autoresearch_dagster.spec import Budget

        return Budget(initial_runs_per_arm=self.initial_runs_per_arm, max_runs_per_arm=self.max_runs_per_arm)
