"""Prediction scores: direction hits, interval coverage, per-group aggregates."""
from autoresearch_dagster.agents.scoring import aggregate, score

PRED = {"capacity_ratio": 1.3, "ratio_low": 1.15, "ratio_high": 1.45}


def test_a_prediction_hits_when_the_verdict_goes_its_way_and_covers_when_the_ratio_is_inside():
    s = score(PRED, "better", 1.2, margin=0.03)
    assert s["direction_hit"] and s["covered"] and s["scored"]
    s = score(PRED, "same", 1.01, margin=0.03)
    assert s["direction_hit"] is False and s["covered"] is False
    assert score({"capacity_ratio": 1.01, "ratio_low": 0.95, "ratio_high": 1.07}, "same", 1.0, margin=0.03)["direction_hit"]


def test_invalid_outcomes_are_not_scored_and_aggregates_group_them_out():
    assert score(PRED, "invalid", None, margin=0.03)["scored"] is False
    rows = [{**score(PRED, "better", 1.2, 0.03), "proposer": "offline"},
            {**score(PRED, "worse", 0.8, 0.03), "proposer": "offline"},
            {**score(PRED, "invalid", None, 0.03), "proposer": "offline"}]
    (agg,) = aggregate(rows, by=("proposer",))
    assert agg["n"] == 2 and agg["hit_rate"] == 0.5 and agg["coverage"] == 0.5
