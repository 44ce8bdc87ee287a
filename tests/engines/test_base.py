"""The one drift check every engine and the harness share (engines.base.config_drift)."""
from autoresearch_dagster.engines.base import DRIFT_PREFIX, config_drift


def test_config_drift_names_the_knob_and_the_values():
    drift = config_drift({"max_running_requests": 64, "page_size": 16}, {"max_running_requests": 48})
    assert len(drift) == 2 and all(d.startswith(DRIFT_PREFIX) for d in drift)
    assert "max_running_requests" in drift[0] and "48" in drift[0] and "64" in drift[0]
    assert "page_size" in drift[1] and "not reported" in drift[1]


def test_aliases_and_numbers_resolve_to_the_same_value():
    # the pair that was in dispute: the sglang engine knew bf16 == bfloat16, the harness did not
    resolved = {"chunked_prefill_size": 4096.0, "kv_cache_dtype": "bfloat16"}
    assert config_drift({"chunked_prefill_size": 4096, "kv_cache_dtype": "bf16"}, resolved) == []
    assert config_drift({"kv_cache_dtype": "bf16"}, {"server_args": {"kv_cache_dtype": "bfloat16"}}) == []
    assert config_drift({"kv_cache_dtype": "fp8_e4m3"}, resolved) != []


def test_an_engine_reporting_no_config_has_nothing_to_verify():
    assert config_drift({"page_size": 16}, {}) == []
