"""spec.KNOBS owns what knob values mean: lossy values, aliases, fp8, and SGLang's mixed-chunk rule.

Each fact was once coded again where it was used (``is_lossy``, the emulator's ``FP8_*`` tuples,
``tinymodel.numerics_from_config``, the drift check's alias table, two versions of the rule that
speculative decoding turns mixed chunks off); these tests pin the one table every caller reads.
"""
from __future__ import annotations

import pytest

from autoresearch_dagster.emulator.catalog import gpu, model_card
from autoresearch_dagster.emulator.resolve import resolve_config
from autoresearch_dagster.engines.base import config_drift
from autoresearch_dagster.spec import KNOBS, SpecError, is_lossy, server_overrides, validate_server_config
from autoresearch_dagster.tinymodel import Numerics, numerics_from_config, resolve_server_args


def _resolved(config: dict) -> dict:
    return resolve_config(model_card("llama-3.1-8b"), gpu("H100"), 1, config).knobs


# ---------------------------------------------------------------- lossy / lossless, per kind of value

@pytest.mark.parametrize("config", [{"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype": "fp8_e5m2"},
                                    {"quantization": "fp8"}, {"quantization": "w8a8_fp8"}])
def test_fp8_precisions_are_lossy(config):
    assert is_lossy(config)
    assert is_lossy(config, {"kv_cache_dtype": "bf16", "quantization": "unquant"})


@pytest.mark.parametrize("config", [{"kv_cache_dtype": "auto"}, {"kv_cache_dtype": "bf16"},
                                    {"kv_cache_dtype": "bfloat16"}, {"quantization": None},
                                    {"quantization": "unquant"}])
def test_the_checkpoints_own_precision_is_lossless(config):
    assert not is_lossy(config)


@pytest.mark.parametrize("config", [{"enable_mixed_chunk": True}, {"chunked_prefill_size": 2048},
                                    {"schedule_conservativeness": 0.3}, {"schedule_policy": "lpm"},
                                    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3},
                                    {"speculative_algorithm": "NGRAM"}, {"mem_fraction_static": 0.92},
                                    {"tp_size": 2}])
def test_scheduling_memory_parallel_and_speculative_values_are_lossless(config):
    assert not is_lossy(config)


def test_lossy_means_a_new_loss_relative_to_the_baseline():
    fp8 = {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}
    assert not is_lossy(fp8, fp8)  # the baseline already has it
    assert not is_lossy({"quantization": None, "kv_cache_dtype": "auto"}, fp8)  # back to the checkpoint's precision
    assert is_lossy({"kv_cache_dtype": "fp8_e5m2"}, {"kv_cache_dtype": "fp8_e4m3"})  # another fp8 format
    assert is_lossy({"quantization": "w8a8_fp8"}, {"quantization": "fp8"})  # another fp8 method
    assert all(not k.meaning(v).lossy for k in KNOBS.values() if not k.meanings for v in k.search_values)


# ---------------------------------------------------------------- aliases

def test_aliases_are_one_value_for_validation_drift_and_lossiness():
    assert KNOBS["kv_cache_dtype"].canonical("bf16") == "bfloat16"
    assert KNOBS["speculative_algorithm"].canonical("NEXTN") == "EAGLE"
    assert KNOBS["kv_cache_dtype"].canonical("fp8_e4m3") == "fp8_e4m3"
    assert validate_server_config({"kv_cache_dtype": "bf16"}) == {"kv_cache_dtype": "bf16"}  # kept as spelled
    assert config_drift({"kv_cache_dtype": "bf16"}, {"kv_cache_dtype": "bfloat16"}) == []
    assert config_drift({"speculative_algorithm": "NEXTN"}, {"speculative_algorithm": "EAGLE"}) == []
    assert config_drift({"speculative_algorithm": "EAGLE3"}, {"speculative_algorithm": "EAGLE"}) != []
    assert not is_lossy({"kv_cache_dtype": "bf16"}, {"kv_cache_dtype": "bfloat16"})
    # the emulator reports what SGLang resolves an alias to, and the drift check accepts it
    nextn = _resolved({"speculative_algorithm": "NEXTN"})
    assert nextn["speculative_algorithm"] == "EAGLE"
    assert config_drift({"speculative_algorithm": "NEXTN"}, nextn) == []
    assert _resolved({"quantization": "unquant"})["quantization"] == "unquant"  # reported as given: no drift


# ---------------------------------------------------------------- what fp8 means

def test_fp8_values_mean_the_same_to_the_emulator_and_the_tiny_model():
    base = resolve_config(model_card("llama-3.1-8b"), gpu("H100"), 1, {})
    assert (base.fp8_weights, base.kv_bytes) == (False, 2.0)
    for quant, scales in (("fp8", "per_tensor"), ("w8a8_fp8", "per_channel")):
        assert resolve_config(model_card("llama-3.1-8b"), gpu("H100"), 1, {"quantization": quant}).fp8_weights
        assert numerics_from_config({"quantization": quant}) == Numerics(weight_fp8=scales, act_fp8=True)
    for kv, fmt in (("fp8_e4m3", "e4m3"), ("fp8_e5m2", "e5m2")):
        assert resolve_config(model_card("llama-3.1-8b"), gpu("H100"), 1, {"kv_cache_dtype": kv}).kv_bytes == 1.0
        assert numerics_from_config({"kv_cache_dtype": kv}) == Numerics(kv_fp8=fmt)
    for lossless in ({"kv_cache_dtype": "bf16"}, {"kv_cache_dtype": "auto"}, {"quantization": "unquant"}):
        r = resolve_config(model_card("llama-3.1-8b"), gpu("H100"), 1, lossless)
        assert (r.fp8_weights, r.kv_bytes) == (False, 2.0)
        assert numerics_from_config(lossless) == Numerics()
    # a server may report an fp8 checkpoint's method, which a candidate may not set
    assert KNOBS["quantization"].meaning("modelopt_fp8").fp8 == "e4m3"
    with pytest.raises(SpecError, match="quantization"):
        validate_server_config({"quantization": "modelopt_fp8"})


# ---------------------------------------------------------------- SGLang: speculative decoding vs mixed chunks

@pytest.mark.parametrize("algo, keeps_mixed", [("EAGLE", True), ("EAGLE3", True), ("NEXTN", True),
                                               ("STANDALONE", False), ("NGRAM", False)])
def test_speculative_algorithms_without_mixed_chunk_support_turn_it_off_for_every_caller(algo, keeps_mixed):
    # SGLang 0.5.23 speculative_hook.py: enable_mixed_chunk stays on only where
    # SpeculativeAlgorithm.supports_mixed_chunk() (EAGLE, EAGLE3; NEXTN resolves to EAGLE)
    requested = {"speculative_algorithm": algo, "enable_mixed_chunk": True}
    assert server_overrides(requested)["enable_mixed_chunk"] is keeps_mixed
    assert _resolved(requested)["enable_mixed_chunk"] is keeps_mixed  # the emulator
    assert resolve_server_args(requested)["enable_mixed_chunk"] is keeps_mixed  # the tiny SGLang-compatible server
    assert (config_drift(requested, _resolved(requested)) == []) is keeps_mixed
    assert "enable_mixed_chunk" not in server_overrides({"speculative_algorithm": algo})  # never turned on
    assert server_overrides({"enable_mixed_chunk": True}) == {"enable_mixed_chunk": True}  # no speculative decoding


def test_the_operators_guardrails_name_the_engines_knobs():
    from autoresearch_dagster.spec import EndpointSpec

    base = dict(name="demo", model="llama-3.1-8b", hardware={"gpu": "H200", "count": 4}, sla="ttft_p99<=1s")
    spec = EndpointSpec(**base, guardrails={"locked_knobs": ["--tp-size", "quantization"], "max_gpus": 2})
    assert spec.guardrails.locked_knobs == ["quantization", "tp_size"] and spec.max_candidate_gpus == 2
    assert EndpointSpec(**base).max_candidate_gpus == 4 and not EndpointSpec(**base).guardrails.lossless_only
    with pytest.raises(ValueError, match="guardrails.locked_knobs: unknown server knob 'warp_speed'"):
        EndpointSpec(**base, guardrails={"locked_knobs": ["warp_speed"]})
