"""The four-part proposal schema: what a proposer must say, and what the schema refuses."""
import pytest
from pydantic import ValidationError

from autoresearch_dagster.agents.proposal import Intervention, KnobChange, Prediction, Proposal, fails_gate


def _proposal(**kw):
    data = dict(id="p1", endpoint="demo", proposer="offline", source="recipe:x", direction="scheduling_cache",
                explanation="long prefills stall decode (ITL p99/p50 = 5 at the break)",
                intervention={"changes": [{"knob": "enable_mixed_chunk", "value": True}]},
                prediction={"capacity_ratio": 1.3, "ratio_low": 1.1, "ratio_high": 1.5, "basis": "surrogate"},
                falsification="refuted if the verdict is not better")
    data.update(kw)
    return Proposal(**data)


def test_a_valid_proposal_has_all_four_parts_and_a_direction_of_prediction():
    p = _proposal()
    assert p.intervention.delta() == {"enable_mixed_chunk": True}
    assert p.prediction.direction == "up"
    assert _proposal(prediction={"capacity_ratio": 0.9, "ratio_low": 0.8, "ratio_high": 0.95,
                                 "basis": "a model"}).prediction.direction == "down"


@pytest.mark.parametrize("field", ["explanation", "intervention", "prediction", "falsification"])
def test_each_of_the_four_parts_is_required(field):
    data = _proposal().model_dump()
    data.pop(field)
    with pytest.raises(ValidationError):
        Proposal(**data)


def test_the_interval_must_contain_the_predicted_ratio():
    with pytest.raises(ValidationError, match="must contain"):
        Prediction(capacity_ratio=1.6, ratio_low=1.1, ratio_high=1.5, basis="a model")


def test_unknown_knobs_bad_values_and_repeated_knobs_are_refused():
    with pytest.raises(ValidationError, match="unknown knob"):
        KnobChange(knob="gpu_go_brrr", value=1)
    with pytest.raises(ValidationError, match="not allowed"):
        KnobChange(knob="schedule_policy", value="random")
    with pytest.raises(ValidationError, match="each knob once"):
        Intervention(changes=[{"knob": "page_size", "value": 16}, {"knob": "page_size", "value": 1}])
    with pytest.raises(ValidationError, match="at least one"):
        Intervention(changes=[])
    with pytest.raises(ValidationError, match="direction"):
        _proposal(direction="vibes")


def test_an_engine_patch_is_an_intervention():
    p = _proposal(intervention={"patch": {"summary": "overlap the detokenizer with the next forward pass"}})
    assert p.is_patch and p.intervention.delta() == {}


def test_a_failed_gate_set_is_recognized_in_supersets_only():
    failed = [["kv_cache_dtype=fp8_e4m3", "quantization=fp8"]]
    assert fails_gate({"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "page_size": 16}, {}, failed)
    assert fails_gate({"kv_cache_dtype": "fp8_e4m3"}, {}, failed) is None  # fp8 KV alone was never refused
    assert fails_gate({"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
                      {"kv_cache_dtype": "fp8_e4m3"}, failed) is None  # the baseline already had fp8 KV
