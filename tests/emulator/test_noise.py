"""Run-to-run noise: seeded, configurable, and a capacity spread of a few percent between identical runs."""
from __future__ import annotations

import numpy as np

from autoresearch_dagster.emulator.noise import NoiseSettings, NoiseSource
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.measure.capacity import find_capacity
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.spec import SLA

from .helpers import endpoint, pool

SETTINGS = CapacitySettings(step_duration_s=30, min_completed=60, start_rps=3.0, resolution=0.02, warmup_s=0,
                            max_steps=16)


def _capacities(noise: NoiseSettings, seeds: range) -> np.ndarray:
    ep = endpoint(sla="ttft_p99<=3000ms,tpot_p99<=40ms")
    p = pool(n=400, prompt_median=1200, output_median=100, seed=9)
    caps = []
    for s in seeds:  # same schedules (runner seed 0); only the deployment's noise seed changes
        dep = EmulatorEngine(ep, noise=noise).deploy({}, seed=s)
        caps.append(find_capacity(dep, p, SLA.parse(str(ep.sla)), gpus=1, model="m", settings=SETTINGS, seed=0).capacity_rps)
    return np.array(caps)


def test_default_noise_gives_a_few_percent_capacity_spread():
    caps = _capacities(NoiseSettings(), range(4))
    cv = caps.std(ddof=1) / caps.mean()
    assert 0.005 < cv < 0.06, caps


def test_without_noise_identical_runs_are_identical():
    caps = _capacities(NoiseSettings.off(), range(2))
    assert caps[0] == caps[1]


def test_noise_source_is_seeded_and_throttles():
    s = NoiseSettings(clock_cv=0.02, step_jitter_cv=0.03, throttle_rate_per_s=0.5, throttle_duration_s=1.0,
                      throttle_factor=1.5)
    src_a, src_b = NoiseSource(s, 7), NoiseSource(s, 7)
    a = [src_a.factor(t * 0.01) for t in range(5000)]
    b = [src_b.factor(t * 0.01) for t in range(5000)]
    assert a == b
    f = np.array(a)
    assert 0.9 < np.median(f) < 1.1
    assert (f > 1.3).mean() > 0.1  # throttled stretches exist ...
    assert (f > 1.3).mean() < 0.7  # ... but do not dominate
