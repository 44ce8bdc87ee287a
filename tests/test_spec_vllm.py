"""The knob table's engine dimension: vLLM's EngineArgs names beside SGLang's ServerArgs names."""
from __future__ import annotations

import pytest

from autoresearch_dagster.spec import (
    KNOBS, KNOBS_BY_ENGINE, VLLM_KNOBS, EndpointSpec, SpecError, is_lossy, knob_table, knobs_for, launch_flags,
    validate_server_config,
)


def _endpoint(engine: str, config: dict) -> EndpointSpec:
    return EndpointSpec.model_validate({"name": "e", "model": "m", "hardware": {"gpu": "H200"},
                                        "sla": "ttft_p99<=1s", "engine": engine, "server_config": config})


def test_each_engine_reads_its_table():
    assert knobs_for("vllm") is VLLM_KNOBS
    for engine in ("emulator", "sglang", "modal", "external"):
        assert knobs_for(engine) is KNOBS and knob_table(engine) == "sglang"
    assert set(KNOBS_BY_ENGINE) == {"sglang", "vllm"}
    for name in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "long_prefill_token_threshold",
                 "enable_prefix_caching", "block_size", "kv_cache_dtype", "scheduling_policy"):
        k = VLLM_KNOBS[name]
        assert k.tradeoff and k.direction and name not in KNOBS or name == "kv_cache_dtype"


def test_vllm_names_are_refused_on_sglang_endpoints_and_the_other_way():
    assert _endpoint("vllm", {"max_num_seqs": 32}).server_config == {"max_num_seqs": 32}
    with pytest.raises(ValueError, match="server_config: unknown vllm server knob 'max_running_requests'"):
        _endpoint("vllm", {"max_running_requests": 32})
    with pytest.raises(ValueError, match="unknown server knob .max_num_seqs."):
        _endpoint("emulator", {"max_num_seqs": 32})
    assert _endpoint("emulator", {"max_running_requests": 32}).knobs is KNOBS


def test_vllm_values_are_checked_against_the_table():
    assert validate_server_config({"--max-num-seqs": 64, "block-size": 64}, "vllm") == {"max_num_seqs": 64,
                                                                                       "block_size": 64}
    with pytest.raises(SpecError, match="'block_size' = 48 is not allowed"):
        validate_server_config({"block_size": 48}, "vllm")
    with pytest.raises(SpecError, match="below its minimum"):
        validate_server_config({"max_num_seqs": 0}, "vllm")
    with pytest.raises(SpecError, match="choose one of: 'fcfs', 'priority'"):
        validate_server_config({"scheduling_policy": "lpm"}, "vllm")


def test_vllm_booleans_are_spelled_both_ways_sglang_unchanged():
    assert launch_flags({"enable_prefix_caching": False, "enable_chunked_prefill": True, "max_num_seqs": 8},
                        "vllm") == ["--no-enable-prefix-caching", "--enable-chunked-prefill", "--max-num-seqs", "8"]
    assert launch_flags({"enable_mixed_chunk": False, "disable_radix_cache": True}) == ["--disable-radix-cache"]


def test_lossy_reads_the_engines_meanings():
    assert is_lossy({"kv_cache_dtype": "fp8"}, {}, "vllm")  # vLLM's fp8 is e4m3
    assert is_lossy({"kv_cache_dtype": "fp8_e5m2"}, {}, "vllm")
    assert not is_lossy({"kv_cache_dtype": "auto", "max_num_seqs": 8}, {"kv_cache_dtype": "fp8"}, "vllm")
    assert not is_lossy({"dtype": "float32"}, {}, "vllm")
