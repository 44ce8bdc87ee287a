"""Proposers' search space and the guardrails read the knob table of the endpoint's engine."""
from autoresearch_dagster.agents.guardrails import Guardrails, check, resolved_config
from autoresearch_dagster.agents.proposal import KnobChange, lossy_settings
from autoresearch_dagster.agents.search import SearchSpace, normalize, static_problem
from autoresearch_dagster.spec import KNOBS, VLLM_KNOBS
from tests.agents.test_guardrails import _p

VLLM_RESOLVED = {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
                 "enable_prefix_caching": True, "block_size": 128, "tensor_parallel_size": 1}


def test_guardrails_check_vllm_knobs_on_a_vllm_endpoint():
    g = Guardrails(gpus=1, engine="vllm")
    ok = check(_p({"max_num_seqs": 64}), {"enable_prefix_caching": True}, VLLM_RESOLVED, g)
    assert ok.accepted and ok.candidate_config == {"enable_prefix_caching": True, "max_num_seqs": 64}
    far = check(_p({"max_num_batched_tokens": 256}), {}, VLLM_RESOLVED, g)  # x8 from the resolved 2048
    assert not far.accepted and "x8 step" in far.reasons[0]
    wrong = check(_p({"max_running_requests": 64}), {}, VLLM_RESOLVED, g)
    assert not wrong.accepted and "max_running_requests: not vllm's knob" in wrong.reasons[0]
    sglang = check(_p({"max_num_seqs": 64}), {}, {}, Guardrails(gpus=1))
    assert not sglang.accepted and "not sglang's knob" in sglang.reasons[0]
    assert not check(_p({"tensor_parallel_size": 2}), {}, VLLM_RESOLVED, g).accepted


def test_resolved_config_keeps_the_engines_knobs():
    info = {"server_args": {**VLLM_RESOLVED, "max_running_requests": 5, "weird": 1}}
    assert resolved_config(info, "vllm") == VLLM_RESOLVED
    assert resolved_config(info) == {"max_running_requests": 5}


def test_search_space_and_normalize_per_engine():
    space = SearchSpace.full(1, {}, "vllm")
    assert space.engine == "vllm" and set(space.choices) <= set(VLLM_KNOBS)
    assert {"max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching"} <= set(space.choices)
    narrowed = space.around(["max_num_seqs"], VLLM_RESOLVED, max_step=2.0)
    # None (leave it to vLLM) is the baseline's own value; 8..32 lie beyond x2 of the resolved 128
    assert narrowed.engine == "vllm" and narrowed.choices == {"max_num_seqs": (None, 64, 128, 256)}
    cfg = narrowed.config({"max_num_seqs": 64}, {}, VLLM_RESOLVED)
    assert cfg == {"max_num_seqs": 64} and narrowed.params_of(cfg) == {"max_num_seqs": 64}
    assert normalize({"max_num_seqs": 128}, {}, VLLM_RESOLVED, "vllm") == {}  # the value the server resolves anyway
    assert set(SearchSpace.full(1, {}).choices) <= set(KNOBS)
    assert static_problem({"tensor_parallel_size": 2}, 1, "vllm") == "tensor_parallel_size = 2 exceeds 1 GPU(s)"
    assert static_problem({"max_num_seqs": 8}, 1, "vllm") is None


def test_proposals_name_any_engines_knob_and_lossy_reads_the_engine():
    assert KnobChange(knob="max_num_seqs", value=64).value == 64
    assert KnobChange(knob="kv_cache_dtype", value="fp8").value == "fp8"  # vLLM's spelling, not SGLang's
    assert lossy_settings({"kv_cache_dtype": "fp8"}, "vllm") == ["kv_cache_dtype=fp8_e4m3"]
    assert lossy_settings({"kv_cache_dtype": "fp8_e4m3"}) == ["kv_cache_dtype=fp8_e4m3"]
