"""A small, fast campaign setup on the emulator: an endpoint whose knobs matter and short measurements."""
from __future__ import annotations

from pathlib import Path

from autoresearch_dagster.campaign.loop import CampaignRunner
from autoresearch_dagster.campaign.state import CampaignSettings
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.measure.profiles import measurement_profile
from autoresearch_dagster.memory import Memory
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import CampaignBudget

from ..agents.helpers import long_prompt_pool, small_endpoint

# the small endpoint holds ~7-8 req/s (the emulator's fitted factors): a search from 4 req/s confirms it in ~9 steps
TINY = measurement_profile("standard").with_overrides(
    step_duration_s=20.0, min_completed=30, start_rps=4.0, resolution=0.1, warmup_s=0.0, max_steps=14, noise_runs=5,
    initial_runs_per_arm=3, max_runs_per_arm=6, quick_diagnosis=True)


def settings(*, search_trials: int = 0, **budget) -> CampaignSettings:
    """Every direction opened, recipes only (no search trials): the loop's logic at a test's speed."""
    return CampaignSettings(directions_per_round=4, experiments_per_round=2, search_trials=search_trials,
                            diagnosis_probes=False,
                            budget=CampaignBudget(**{"max_experiments": 3, "max_concurrent_gpus": 1, **budget}))


def runner(tmp: Path, *, settings_=None, pool=None, memory: Path | None = None, proposers=None, endpoint=None,
           fresh: bool = False, say=None, measurement=None, engine=None) -> CampaignRunner:
    ep = endpoint or small_endpoint(engine_options={"hidden_factors_seed": 5})
    pool = pool if pool is not None else long_prompt_pool(tmp)
    return CampaignRunner(ep, pool, engine=engine or EmulatorEngine(ep), out_dir=tmp / "campaign",
                          settings=settings_ or settings(), measurement=measurement or TINY, results=open_lake(tmp / "lake"),
                          memory=Memory(memory or tmp / "memory"), proposers=proposers, fresh=fresh, say=say)
