"""bench_drafter's core: on a slice of the demo logs the adapted drafter beats the starting one on held-out
traffic with the gate passed, redacted vs original text is measured for both, and the emulated capacity
follows the measured acceptance it is given."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import bench_drafter as bd
from autoresearch_dagster.drafter.settings import DrafterSettings
from autoresearch_dagster.spec import load_endpoint

ROOT = Path(__file__).resolve().parents[2]


def test_bench_core_adapted_beats_starting_on_held_out_with_the_gate_and_the_redaction_effect(tmp_path, capsys):
    s = DrafterSettings(steps=60, target_steps=80, measure_requests=4, max_new=12, windows=2, prompt_len=24,
                        new_tokens=16)
    res = bd.run_bench([ROOT / "examples/logs/demo_chat.jsonl"], tmp_path, settings=s, capacity=False,
                       max_records=300, log=lambda m: None)
    held = res["report"]["acceptance"]["held_out"]
    assert held["adapted"]["requests"] > 0
    assert held["adapted"]["mean_accept_length"] > held["starting"]["mean_accept_length"]
    assert res["ratio_held_out"] == held["adapted_over_starting"] > 1.0
    assert res["target_met"] == (res["ratio_held_out"] >= bd.TARGET_RATIO)
    assert res["gate_passed"]
    red = res["report"]["redaction_effect"]
    assert red["pairs_measured"] > 0 and set(red["by_drafter"]) == {"starting", "adapted"}
    assert "capacity" not in res
    bd.print_results(res)
    text = capsys.readouterr().out
    assert "correctness gate" in text and "PASSED" in text and "redacted vs original text" in text
    assert f"{res['ratio_held_out']:.2f}x (target >= 1.3x)" in text


def test_capacity_follows_the_measured_acceptance_under_a_tight_tpot_sla(tmp_path):
    ep = load_endpoint(ROOT / "examples/endpoints/demo.yaml")
    from autoresearch_dagster.pool.build import build_pool

    pool = build_pool([ROOT / "examples/logs/demo_chat.jsonl"], "demo", tmp_path / "pool", key=bd.POOL_KEY,
                      max_records=600).pool_path
    low, high = tmp_path / "low.json", tmp_path / "high.json"
    low.write_text(json.dumps({"k": 4, "per_position": [0.2, 0.1, 0.1, 0.1]}))
    high.write_text(json.dumps({"k": 4, "per_position": [0.9, 0.85, 0.85, 0.8]}))
    cap = bd.capacity_table(ep, pool, {"starting": low, "adapted": high}, k=4, slas={"tight": bd.TIGHT_SLA},
                            step_s=15.0, log=lambda m: None)
    row = cap["tight"]
    assert set(row) == {"off", "starting", "adapted"}
    assert row["adapted"]["config"]["speculative_algorithm"] == "EAGLE"
    assert row["adapted"]["config"]["speculative_num_draft_tokens"] == 5
    assert row["off"]["config"].get("speculative_algorithm") is None
    assert row["adapted"]["capacity_rps"] > row["starting"]["capacity_rps"]
