"""Offline four-part proposals from a diagnostic report and candidate files."""
import pytest
from pydantic import ValidationError

from autoresearch_dagster.agents.proposal import Proposal, make_proposals
from autoresearch_dagster.spec import config_hash

REPORT = {"hypotheses": [
    {"bottleneck": "prefill_interference", "direction": "scheduling_cache", "score": 0.6,
     "evidence": ["TPOT p99 breaks first at 20 rps", "prefill steps interrupt decode 40% of the time"],
     "knobs": ["enable_mixed_chunk", "chunked_prefill_size"]},
    {"bottleneck": "missed_prefix_reuse", "direction": "scheduling_cache", "score": 0.3,
     "evidence": ["prefix hit rate 0.62 in the pool, 0.20 measured"], "knobs": ["schedule_policy"]},
    {"bottleneck": "burst_queueing", "direction": "parallel_admission", "score": 0.1,
     "evidence": [], "knobs": ["dp_size"]},
]}


def test_candidate_files_first_then_the_top_hypotheses_knobs():
    props = make_proposals("demo", REPORT, {}, {"demo_better": {"enable_mixed_chunk": True}}, margin=0.03)
    assert props[0].id == "demo_better" and props[0].source == "candidate_file"
    assert props[0].hypothesis == "prefill_interference"  # matched through the knob it changes
    assert "TPOT p99 breaks first" in props[0].explanation
    diag = [p for p in props if p.source == "diagnosis"]
    # enable_mixed_chunk=True is already the candidate file's config: not proposed twice
    assert [(p.hypothesis, p.intervention) for p in diag] == [
        ("prefill_interference", {"chunked_prefill_size": 2048}),
        ("missed_prefix_reuse", {"schedule_policy": "lpm"}),
    ]
    assert "dp_size" not in {k for p in props for k in p.intervention}  # only the top two hypotheses
    for p in props:
        assert p.prediction.value == pytest.approx(1.03) and "1.030" in p.falsifier and p.explanation


def test_baseline_equal_and_already_tested_configs_are_left_out():
    baseline = {"enable_mixed_chunk": True}
    tested = {config_hash({"enable_mixed_chunk": True, "chunked_prefill_size": 2048})}
    props = make_proposals("demo", REPORT, baseline, {"demo_better": {"enable_mixed_chunk": True}},
                           margin=0.02, tested=tested)
    assert [p.intervention for p in props] == [{"enable_mixed_chunk": False}, {"schedule_policy": "lpm"}]
    assert all(p.candidate_config["enable_mixed_chunk"] is not None for p in props)


def test_a_proposal_needs_all_four_parts():
    with pytest.raises(ValidationError):
        Proposal(id="x", endpoint="demo", source="diagnosis", explanation="e", intervention={},
                 candidate_config={}, falsifier="f")
