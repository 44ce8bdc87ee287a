"""The pre-screen: promising candidates (calibrated emulator's corrected ratio above 1 + gain x margin) go on."""
from autoresearch_dagster.agents.prescreen import prescreen
from autoresearch_dagster.agents.proposal import Intervention, KnobChange, Prediction, Proposal


def _p(pid, knob, value, *, kind="experiment", source="recipe"):
    return Proposal(id=pid, endpoint="small", proposer="claude", source=source, direction="scheduling_cache", kind=kind,
                    explanation="a change the proposer explains", falsification="refuted if it is not better",
                    intervention=Intervention(changes=[KnobChange(knob=knob, value=value)]),
                    prediction=Prediction(capacity_ratio=1.5, ratio_low=1.2, ratio_high=1.8, confidence=0.8,
                                       basis="the proposer's own estimate"),
                    candidate_config={knob: value})


class FakePredictor:
    """Emulator ratios per candidate chunk size (what the calibrated surrogate would say)."""
    ratios = {1024: 1.01, 2048: 1.08, 4096: 1.20, 8192: None}

    def __init__(self):
        self.asked = []

    def predict(self, base, configs):
        self.asked += configs
        out = []
        for c in configs:
            r = self.ratios[c["chunked_prefill_size"]]
            out.append({"feasible": False, "reason": "does not fit"} if r is None else
                       {"feasible": True, "ratio": r, "raw_ratio": r / 1.02, "low": r * 0.9, "high": r * 1.1})
        return out


def test_only_promising_candidates_go_to_the_real_engine_whatever_their_proposer_claimed():
    props = [_p("a", "chunked_prefill_size", 1024), _p("b", "chunked_prefill_size", 4096),
             _p("c", "chunked_prefill_size", 8192), _p("d", "chunked_prefill_size", 2048)]
    res = prescreen(props, FakePredictor(), {}, margin=0.05, gain=1.0, slots=3)
    assert [p.id for p in res.kept] == ["b", "d"]  # order kept; 1.08 and 1.20 clear 1.05
    why = {s["proposal_id"]: s["reasons"][0] for s in res.screened}
    assert set(why) == {"a", "c"} and "1.010x" in why["a"] and "infeasible" in why["c"]
    assert all(s["status"] == "screened" for s in res.screened) and res.predictions["b"]["ratio"] == 1.20


def test_the_gain_sets_the_floor_and_slots_cap_the_round():
    props = [_p("b", "chunked_prefill_size", 4096), _p("d", "chunked_prefill_size", 2048)]
    assert [p.id for p in prescreen(props, FakePredictor(), {}, margin=0.05, gain=2.0, slots=3).kept] == ["b"]
    res = prescreen(props, FakePredictor(), {}, margin=0.05, gain=1.0, slots=1)
    assert [p.id for p in res.kept] == ["b"] and not res.screened  # promising past the slots: not screened


def test_controls_and_measured_follow_ups_are_exempt():
    pred = FakePredictor()
    props = [_p("ctl", "chunked_prefill_size", 1024, kind="control"),
             _p("fu", "chunked_prefill_size", 1024, kind="follow_up", source="measured_follow_up")]
    res = prescreen(props, pred, {}, margin=0.05, gain=1.0, slots=3)
    assert [p.id for p in res.kept] == ["ctl", "fu"] and pred.asked == []
