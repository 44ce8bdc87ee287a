"""The promotion rule: only a confirmed, valid, correctness-passing "better" is promoted."""
from autoresearch_dagster.experiments.promotion import decide_promotion


def _v(cid, verdict, ci_low, **kw):
    return {"candidate_id": cid, "verdict": verdict, "ratio_median": ci_low + 0.05, "ci_low": ci_low,
            "ci_high": ci_low + 0.1, "margin": 0.02, "confirmed": True, "invalid_reasons": [],
            "correctness": None, "candidate_config": {"schedule_policy": cid}, **kw}


def test_best_confirmed_better_by_ci_low_is_promoted():
    d = decide_promotion([_v("a", "better", 1.05), _v("b", "better", 1.10), _v("c", "same", 0.99)])
    assert d.promote and d.candidate_id == "b" and d.server_config == {"schedule_policy": "b"}
    assert "b is better" in d.reason and d.evidence["ci_low"] == 1.10


def test_unconfirmed_invalid_or_gate_failed_candidates_are_not_promoted():
    d = decide_promotion([_v("a", "better", 1.2, confirmed=False),
                          _v("b", "better", 1.2, invalid_reasons=["config drift"]),
                          _v("c", "better", 1.2, correctness={"passed": False}),
                          _v("d", "worse", 0.8)])
    assert not d.promote and d.candidate_id is None
    assert "d: worse" in d.reason


def test_nothing_tested_is_no_promotion():
    d = decide_promotion([])
    assert not d.promote and "nothing tested" in d.reason
