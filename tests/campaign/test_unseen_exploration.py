"""On an endpoint nobody tuned, a surrogate that predicts "no gain" everywhere is a guess: the campaign measures."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autoresearch_dagster.agents.offline import exploration_pick, measured_in
from autoresearch_dagster.agents.proposal import ResearchBrief
from autoresearch_dagster.cli import main
from autoresearch_dagster.spec import config_hash

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Trial:
    config: dict


def test_exploration_takes_the_widest_interval_that_reaches_the_floor_and_skips_tested_configs():
    a, b, c = Trial({"x": 1}), Trial({"x": 2}), Trial({"x": 3})
    preds = {config_hash(a.config): {"feasible": True, "ratio": 0.99, "high": 1.10},
             config_hash(b.config): {"feasible": True, "ratio": 0.97, "high": 1.20},
             config_hash(c.config): {"feasible": False, "reason": "oom"}}
    assert exploration_pick([a, b, c], preds, set(), 1.03) is b
    assert exploration_pick([a, b, c], preds, {config_hash(b.config)}, 1.03) is a
    # the surrogate's interval rules a confirmable gain out: nothing to explore, the direction closes with that reason
    assert exploration_pick([a, b, c], preds, set(), 1.25) is None


def _brief(history):
    return ResearchBrief(campaign_id="c", round=2, endpoint="e", model="m", gpu="H200", gpus=1, engine="sglang",
                         sla="ttft_p99<=1s", pool_id="p", baseline_config={}, baseline_hash="B", direction="speculative",
                         question="q", history=history)


def test_a_direction_counts_as_measured_only_with_a_verdict_on_the_current_baseline():
    assert not measured_in(_brief([]))
    assert not measured_in(_brief([{"direction": "speculative", "verdict": "same", "baseline_hash": "OLD"}]))
    assert not measured_in(_brief([{"direction": "kernels_quant", "verdict": "same", "baseline_hash": "B"}]))
    assert measured_in(_brief([{"direction": "speculative", "verdict": "worse", "baseline_hash": "B"}]))


def test_a_dense_model_with_a_streaming_sla_on_an_unseen_trace_runs_experiments_in_round_one(tmp_path, monkeypatch):
    spec = tmp_path / "dense32.yaml"
    spec.write_text(
        "name: dense32-azure\nmodel: qwen2.5-32b\nhardware: {gpu: H200, count: 1}\n"
        "sla: 'ttft_p99<=8000ms,itl_p99<=150ms,errors<=1%'\nserver_config: {}\n"
        f"workload: {{logs: ['{REPO / 'examples/traces/azure_sample.csv'}'], format: azure, mode: capacity}}\n"
        "engine: emulator\nengine_options: {hidden_factors_seed: 1234}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTORESEARCH_REDACTION_KEY", "unseen-endpoint-test")
    assert main(["campaign", "run", "--endpoint", str(spec), "--out", str(tmp_path / "c"),
                 "--budget-experiments", "2"]) == 0
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    assert len(report["experiments"]) == 2, report["ended_because"]
    plan = json.loads((tmp_path / "c" / "rounds" / "001" / "plan.json").read_text())
    assert plan["proposals"], "round 1 must test the leading hypotheses"
    # the surrogate predicts below the floor for some direction, which is measured anyway (never closed on a guess)
    explored = [p for p in plan["proposals"] if p["source"].startswith("explore")]
    assert explored and all("Exploration:" in p["explanation"] for p in explored)
    assert all(e["verdict"] for e in report["experiments"])
