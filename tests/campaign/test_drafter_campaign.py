"""The speculative direction adapts the drafter: rehearsal, proposal from the measured acceptance, full training
counted in the budget, then an experiment through the shared harness (campaign.drafter_step)."""
from __future__ import annotations

import json
import random

import pytest

from autoresearch_dagster.campaign.drafter_step import PATH_KNOB, SOURCE, rehearsal_verdict
from autoresearch_dagster.emulator.spec_acceptance import drafter_acceptance
from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool

from ..agents.helpers import small_endpoint
from . import helpers

pytest.importorskip("torch")

# tiny trainer settings: the loop's logic at a test's speed (the trainer itself is tested in tests/drafter/)
TRAIN = {"steps": 40, "target_steps": 60, "measure_requests": 6, "max_new": 16, "new_tokens": 24, "windows": 2}
_ITEMS = ["invoice", "refund", "parcel", "password reset", "warranty claim", "delivery slot"]
_STATES = ["was approved", "is on hold", "was shipped today", "needs a signature", "was escalated"]


def _text(rng: random.Random, i: int) -> str:
    item, state = rng.choice(_ITEMS), rng.choice(_STATES)
    return (f"Ticket {1000 + i}: the {item} for this account {state}. Agent note: the {item} {state}; "
            f"reply with the standard {item} template and close the ticket when the customer confirms.")


def _pool(tmp, n: int = 160):
    """Support-desk traffic in a style of its own (nothing like the trainer's generic chat corpus)."""
    rng = random.Random(5)
    rows = []
    for i in range(n):
        rows.append(PoolRequest(id=f"q{i}", arrival_s=i * 0.4, conversation_id=f"c{i}", turn=0, api="chat",
                                messages=[{"role": "user", "content": _text(rng, i)}], prompt=None, tools=None,
                                tool_choice=None, response_format=None, sampling={},
                                prompt_tokens=rng.randint(200, 900), output_tokens=rng.randint(150, 400),
                                block_hashes=[], block_tokens=64, split="training" if i % 2 else "serving"))
    return read_pool(write_pool(rows, tmp / "pool", {"token_counter": "test"}))


def test_the_rehearsal_stops_a_drafter_that_does_not_accept_more():
    base = {"held_out_starting": 1.5, "held_out_adapted": 1.52, "held_out_ratio": 1.013, "gate_passed": True}
    assert "under the 1.05x" in rehearsal_verdict(base, 1.05)
    assert rehearsal_verdict({**base, "held_out_adapted": 1.8, "held_out_ratio": 1.2}, 1.05) is None
    assert "gate failed" in rehearsal_verdict({**base, "held_out_ratio": 1.2, "gate_passed": False}, 1.05)


def test_a_config_naming_a_drafter_brings_its_measured_acceptance(tmp_path):
    assert drafter_acceptance({}) is None
    assert drafter_acceptance({PATH_KNOB: str(tmp_path)}) is None  # a stock drafter's weights: the algorithm's rate
    (tmp_path / "acceptance.json").write_text(json.dumps({"per_position": [0.9, 0.8, 0.7]}))
    assert drafter_acceptance({PATH_KNOB: str(tmp_path)}).rates(4) == [0.9, 0.8, 0.7, 0.7]


def test_a_campaign_adapts_the_drafter_and_measures_it(tmp_path):
    # a tight per-token SLA at low load: where speculative decoding can pay
    ep = small_endpoint(sla="ttft_p99<=8s,tpot_p99<=14ms,errors<=1%", engine_options={"hidden_factors_seed": 5})
    s = helpers.settings(max_experiments=1).model_copy(update={
        "drafter": True, "drafter_rehearsal_steps": 15, "drafter_min_gain": 1.0, "drafter_train": TRAIN})
    lines: list[str] = []
    r = helpers.runner(tmp_path, settings_=s, pool=_pool(tmp_path), endpoint=ep, say=lines.append)
    summary = r.run()
    st = r.state
    assert len(st.drafters) == 1, lines
    d = st.drafters[0]
    assert d["rehearsal"]["steps"] == 15 and d["rehearsal"]["gate_passed"], d
    assert d["rehearsal"]["held_out_adapted"] > d["rehearsal"]["held_out_starting"], d
    spent_training = d["rehearsal"]["wall_s"] + (d.get("full") or {}).get("wall_s", 0.0)
    experiments_gpu = sum(float(e.get("gpu_seconds") or 0.0) for e in st.experiments)
    assert st.spent["gpu_seconds"] >= experiments_gpu + spent_training - 1e-6  # training counted in the budget
    if d["status"] != "proposed":  # the surrogate's bound with the measured acceptance ruled it out: said why
        assert "drafter adaptation" in d["note"] and st.experiments == [], d
        pytest.fail(f"expected the drafter experiment on this endpoint; the campaign said: {d['note']}")
    exp = next(e for e in st.experiments if e["source"] == SOURCE)
    assert exp["ran"] and exp["verdict"] in {"better", "same", "worse"}, exp
    assert exp["drafter"]["steps"] == TRAIN["steps"] and exp["drafter"]["gate_passed"]
    path = exp["candidate_config"][PATH_KNOB]
    assert path == d["dir"] and (tmp_path / "campaign" / "drafters").is_dir()
    # the experiment's engine served the full training's measured acceptance, not the rehearsal's
    acc = json.loads((tmp_path / "campaign" / "drafters" / path.rsplit("/", 1)[1] / "acceptance.json").read_text())
    assert drafter_acceptance(exp["candidate_config"]).per_position == tuple(acc["per_position"])
    full_report = json.loads((tmp_path / "campaign" / "drafters" / path.rsplit("/", 1)[1] / "acceptance_report.json")
                             .read_text())
    assert full_report["target"].get("cached"), "the full run serves the rehearsal's target, not a retrained one"
    assert st.status == "ended" and summary["experiments"]
    print(f"drafter: rehearsal {d['rehearsal']}; full {exp['drafter']}; verdict {exp['verdict']} "
          f"{exp['ratio_median']}; predicted {exp['prediction']['capacity_ratio']}")
