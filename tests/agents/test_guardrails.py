"""The guardrails every proposal passes, whoever proposed it."""
from autoresearch_dagster.agents.guardrails import Guardrails, check, resolved_config
from autoresearch_dagster.agents.proposal import Proposal

RESOLVED = {"chunked_prefill_size": 8192, "max_running_requests": 2048, "tp_size": 1, "dp_size": 1,
            "schedule_conservativeness": 1.0, "enable_mixed_chunk": False}


def _p(changes, justification=""):
    return Proposal(id="p", endpoint="e", proposer="t", source="s", direction="parallel_admission",
                    explanation="an explanation", falsification="a falsification",
                    intervention={"changes": [{"knob": k, "value": v} for k, v in changes.items()],
                                  "justification": justification},
                    prediction={"capacity_ratio": 1.1, "ratio_low": 1.0, "ratio_high": 1.2, "basis": "a model"})


def test_numeric_steps_beyond_the_limit_need_a_justification_and_stay_bounded():
    g = Guardrails(gpus=1)
    assert check(_p({"chunked_prefill_size": 4096}), {}, RESOLVED, g).accepted  # x2
    far = check(_p({"max_running_requests": 256}), {}, RESOLVED, g)  # x8 without a reason
    assert not far.accepted and "x8 step" in far.reasons[0]
    ok = check(_p({"max_running_requests": 256}, justification="the batch never exceeds 200 at the knee: "
                  "the admission cap is not binding"), {}, RESOLVED, g)
    assert ok.accepted and ok.candidate_config == {"max_running_requests": 256} and "justified" in ok.notes[0]
    too_far = check(_p({"max_running_requests": 32}, justification="a long and detailed justification"),
                    {}, RESOLVED, g)
    assert not too_far.accepted and "x8 limit" in too_far.reasons[0]


def test_gpus_speculative_parameters_and_sglang_overrides_are_checked():
    g = Guardrails(gpus=2)
    assert not check(_p({"tp_size": 2, "dp_size": 2}), {}, RESOLVED, g).accepted
    assert check(_p({"dp_size": 2}), {}, RESOLVED, g).accepted
    stray = check(_p({"speculative_num_steps": 3}), {}, RESOLVED, g)
    assert not stray.accepted and "without a speculative_algorithm" in stray.reasons[0]
    drift = check(_p({"speculative_algorithm": "NGRAM", "enable_mixed_chunk": True}), {}, RESOLVED, g)
    assert not drift.accepted and "override" in drift.reasons[0]


def test_locked_knobs_too_many_changes_and_no_change_are_refused():
    g = Guardrails(gpus=1, locked=("page_size",), max_changes=2)
    assert "locked" in check(_p({"page_size": 16}), {}, RESOLVED, g).reasons[0]
    many = check(_p({"schedule_policy": "lpm", "stream_interval": 2, "enable_mixed_chunk": True}), {}, RESOLVED, g)
    assert any("at most 2" in r for r in many.reasons)
    same = check(_p({"enable_mixed_chunk": True}), {"enable_mixed_chunk": True}, RESOLVED, g)
    assert not same.accepted and "equals the baseline" in same.reasons[-1]


def test_resolved_config_reads_flat_or_nested_server_info():
    assert resolved_config({"server_args": {"page_size": 16, "other": 1}}) == {"page_size": 16}
    assert resolved_config({"page_size": 1, "version": "x"}) == {"page_size": 1}
