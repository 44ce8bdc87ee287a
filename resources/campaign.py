"""Owns the campaign resource: how the loop researches (proposer, round sizes, budgets) and the runner
every loop asset steps."""
from pathlib import Path
from typing import Any

import dagster as dg


class CampaignResource(dg.ConfigurableResource):
    """The campaign's settings (``campaign.state.CampaignSettings``); the Claude key comes from
    ANTHROPIC_API_KEY in the environment only."""

    proposer: str = "offline"
    claude_model: str = "claude-sonnet-4-5"
    directions_per_round: int = 4
    experiments_per_round: int = 3
    search_trials: int = 6
    confirm: str = "remeasure"
    budget_experiments: int | None = 12
    budget_gpu_hours: float | None = None
    deadline_min: float | None = None
    concurrent_gpus: int = 2
    prescreen: bool = False  # pre-screen candidates on the calibrated emulator (agents.prescreen)

    def settings(self, seed: int = 0, probes: bool = True) -> Any:
        from autoresearch_dagster.campaign.state import CampaignSettings
        from autoresearch_dagster.spec import CampaignBudget

        return CampaignSettings(
            proposer=self.proposer, claude_model=self.claude_model, directions_per_round=self.directions_per_round,
            experiments_per_round=self.experiments_per_round, search_trials=self.search_trials, confirm=self.confirm,
            seed=seed, diagnosis_probes=probes, prescreen=self.prescreen,
            budget=CampaignBudget(max_experiments=self.budget_experiments, max_gpu_hours=self.budget_gpu_hours,
                                  max_wall_s=self.deadline_min * 60 if self.deadline_min else None,
                                  max_concurrent_gpus=self.concurrent_gpus))

    def runner(self, spec: Any, pool: Any, *, engine: Any, out_dir: Path, measurement: Any, results: Any,
               memory_dir: Path, seed: int = 0, probes: bool = True, say: Any = None,
               origin: str | None = None) -> Any:
        from autoresearch_dagster.campaign.loop import CampaignRunner
        from autoresearch_dagster.memory import Memory

        return CampaignRunner(spec, pool, engine=engine, out_dir=out_dir, settings=self.settings(seed, probes),
                              measurement=measurement, results=results, memory=Memory(memory_dir), say=say,
                              origin=origin)
