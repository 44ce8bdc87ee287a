"""Owns the measurement settings (``CapacitySettings``) and the named profiles every caller picks from.

A profile says how long each load step is held, how the capacity search runs, how many runs an
arm gets and how deep the diagnosis goes.

One set, chosen by name everywhere: the CLI's ``--measure NAME`` (``run``, ``noise``, ``experiment``,
``diagnose``, ``replay capacity``), Dagster's ``MeasurementSettings(profile=NAME)`` (and
``AUTORESEARCH_MEASURE``) and ``diagnose(measurement=NAME)``. Callers override single fields on top
(``--step-duration``, a resource field), never keep a profile of their own.

- ``standard``: 60 s steps, 100 completions, 5 % resolution; runs per arm 5 → 10 → 20; full diagnosis.
- ``quick``: ``make run``'s. The same load steps as ``standard``, held to 10x the mean E2E latency
  (methods.md §2: fixed 60 s holds on the demo end mid-fill and report ~20 req/s where ~17 is
  sustained; shorter steps make p99 judge on too few requests and the search wander), the
  statistical minimum of 5 runs per arm without escalating, and the quick diagnosis. Quick because it
  runs fewer experiments, not because it measures less carefully.
- ``short``: short steps (40 s, 25 completions, no warm-up, 15 % resolution, 10 steps) and the quick
  diagnosis: a fast look at a setup or a bottleneck (the diagnosis scenarios). Its capacities are
  optimistic near the knee; not for verdicts.

Every profile keeps ``REQUEST_TIMEOUT_S`` as its per-request timeout (the one timeout rule, step.py).

A run whose config's capacity is already estimated searches from that estimate instead of the profile's
start (``CapacitySettings.warmed``): the noise runs after the first, and under a shared control every run of
an arm that has a valid run (``experiment._Experiment.capacity_start``). On the demo that halves the probes.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from autoresearch_dagster.spec import SpecError

# The per-request timeout of every named profile: the one timeout rule of a load step (see step.py).
REQUEST_TIMEOUT_S = 120.0


# A warm-started search (``CapacitySettings.warmed``): its first move from the estimate (about the noise floor's
# spread, so the estimate and one move bracket the value most of the time) and the bisection resolution it stops
# at with the interpolated estimator (measured on the demo at bench_verdicts' 40 s steps, 60 runs each started at
# the baseline's median: run CV 4.5% at 1%, 2% and 3% resolution, 4.6% at 5%; 8.7, 6.6, 6.0 and 5.4 probes per run;
# a cold search from 16 req/s at 1%: CV 5.2%, 11.8 probes)
WARM_GROWTH = 1.05
WARM_RESOLUTION = 0.03


@dataclass
class CapacitySettings:
    """How each load step is held and how the capacity search runs (``capacity.find_capacity``)."""

    step_duration_s: float = 60.0
    min_completed: int = 100
    start_rps: float = 1.0
    growth: float = 2.0
    resolution: float = 0.05
    warmup_s: float = 10.0
    burstiness: float = 1.0
    max_steps: int = 20
    request_timeout_s: float = REQUEST_TIMEOUT_S
    flush_cache: bool = True
    # > 0: hold each step at least this many times the highest mean E2E latency of the passing steps so
    # far (methods.md §2 asks for 10), so steps near the knee reach their steady state; 0: fixed holds
    hold_e2e_multiple: float = 0.0
    # True: ``start_rps`` is an estimate of the capacity (a warm start, e.g. the baseline's noise floor), so
    # the search's first move is ``growth`` (small, e.g. 1.05) and each further move is one growth factor larger
    # (``capacity.grow_bisect(accelerate=True)``); False: a cold search from a low start, doubling
    warm_start: bool = False

    def warmed(self, estimate: float, *, estimator: str = "interp") -> "CapacitySettings":
        """These settings for a search that starts at a capacity ``estimate`` (a warm start: what the baseline's
        noise floor measured). The first probe is the estimate, the first move ``WARM_GROWTH``, each further
        move one factor larger (``capacity.grow_bisect(accelerate=True)``), so a candidate twice as fast is still
        bracketed in a few probes. With the interpolated estimator the bisection stops at ``WARM_RESOLUTION``
        (or this profile's coarser resolution): the crossing is fitted from the probes near the knee, and on
        the demo bisecting on to 1% added 2.7 probes per run and no precision (``WARM_RESOLUTION``'s note)."""
        if not estimate > 0:
            return self
        resolution = max(self.resolution, WARM_RESOLUTION) if estimator == "interp" else self.resolution
        return replace(self, start_rps=float(estimate), growth=WARM_GROWTH, warm_start=True, resolution=resolution)

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise SpecError(f"measurement setting {name} = {getattr(self, name)!r}: it must be {allowed}")

        for name in ("step_duration_s", "start_rps", "burstiness", "request_timeout_s"):
            need(getattr(self, name) > 0, name, "> 0")
        for name in ("warmup_s", "hold_e2e_multiple"):
            need(getattr(self, name) >= 0, name, ">= 0")
        need(self.growth > 1, "growth", "> 1")
        need(0 < self.resolution < 1, "resolution", "between 0 and 1 (relative)")
        need(self.min_completed >= 1, "min_completed", "at least 1")
        need(self.max_steps >= 1, "max_steps", "at least 1")


@dataclass(frozen=True)
class MeasurementProfile:
    name: str
    capacity: CapacitySettings  # every run's load steps and capacity search
    noise_runs: int  # A/A runs of the baseline for its noise floor
    initial_runs_per_arm: int
    max_runs_per_arm: int  # = initial: no escalation
    experiments_per_round: int
    quick_diagnosis: bool  # diagnosis: fewer requests per step and only the quick probes

    def with_overrides(self, **values: Any) -> MeasurementProfile:
        """This profile with some fields replaced; ``CapacitySettings`` fields go into ``capacity``.
        None values are ignored (an option that was not given)."""
        given = {k: v for k, v in values.items() if v is not None}
        cap_names = {f.name for f in fields(CapacitySettings)}
        own = {f.name for f in fields(self)} - {"name", "capacity"}
        unknown = set(given) - cap_names - own
        if unknown:
            raise SpecError(f"unknown measurement setting(s) {sorted(unknown)}")
        return replace(self, capacity=replace(self.capacity, **{k: v for k, v in given.items() if k in cap_names}),
                       **{k: v for k, v in given.items() if k in own})

    def flat(self) -> dict[str, Any]:
        """Every field by name, capacity settings inline (what a flat config such as Dagster's reads)."""
        out = {f.name: getattr(self.capacity, f.name) for f in fields(CapacitySettings)}
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("name", "capacity")})
        return out


_STANDARD = MeasurementProfile(name="standard", capacity=CapacitySettings(), noise_runs=5, initial_runs_per_arm=5,
                               max_runs_per_arm=20, experiments_per_round=1, quick_diagnosis=False)

PROFILES: dict[str, MeasurementProfile] = {
    "standard": _STANDARD,
    "quick": replace(_STANDARD, name="quick", capacity=CapacitySettings(hold_e2e_multiple=10.0), max_runs_per_arm=5,
                     quick_diagnosis=True),
    "short": replace(_STANDARD, name="short", max_runs_per_arm=5, quick_diagnosis=True,
                     capacity=CapacitySettings(step_duration_s=40.0, min_completed=25, warmup_s=0.0, resolution=0.15,
                                               max_steps=10)),
}


def measurement_profile(name: str) -> MeasurementProfile:
    """The named profile, with a capacity settings object of its own (callers may change it)."""
    if name not in PROFILES:
        raise SpecError(f"unknown measurement profile {name!r}; choose from {', '.join(PROFILES)}")
    p = PROFILES[name]
    return replace(p, capacity=replace(p.capacity))
