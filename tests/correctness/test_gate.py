"""The correctness gate over real HTTP against the tiny torch model served with different numerics."""
from __future__ import annotations

import math

import pytest

from autoresearch_dagster.correctness import (GateError, Thresholds, compare_position, emulated_gate, gate,
                                              prompt_set)
from autoresearch_dagster.tinymodel import serve_tiny_model_in_thread

PROMPTS = prompt_set(1, long_chars=400)  # 6 prompts, one per bucket, ~1k scored positions


@pytest.fixture(scope="module")
def reference():
    srv = serve_tiny_model_in_thread("reference", seed=0)
    yield srv
    srv.stop()


def _gate_against(reference, variant: str, **kw):
    cand = serve_tiny_model_in_thread(variant, seed=0)
    try:
        return gate(reference.base_url, cand.base_url, PROMPTS, gen_tokens=16, **kw)
    finally:
        cand.stop()


def test_reference_against_reference_passes(reference):
    res = _gate_against(reference, "reference")
    assert res.passed, res.reasons
    assert res.method == "echo" and res.n_positions > 500
    assert res.kl_mean == 0 and res.top1_agreement == 1 and res.tv_mean == 0 and res.greedy_match == 1
    assert res.threshold == res.calibration["kl_floor"] == 5e-3  # A/A divergence is 0: the floor rules
    assert res.prompt_set["hash"] == PROMPTS.hash and res.prompt_set["n_prompts"] == 6
    d = res.to_dict()
    assert d["passed"] is True and set(d["buckets"]) == {"prose", "multilingual", "code", "json", "chat", "long"}


@pytest.mark.parametrize("variant", ["fp8_kv", "bf16"])
def test_numerics_perturbed_within_tolerance_pass_with_measured_divergence(reference, variant):
    res = _gate_against(reference, variant)
    assert res.passed, res.reasons
    assert 1e-5 < res.kl_mean < res.threshold  # a real, nonzero divergence below the near-lossless floor
    assert 0.95 < res.top1_agreement < 1.0


def test_strict_tolerance_rejects_what_near_lossless_allows(reference):
    res = _gate_against(reference, "noise_small", tolerance="strict")
    assert not res.passed
    assert any("top-1 agreement" in r or "KL" in r for r in res.reasons)


@pytest.mark.parametrize("variant", ["broken_layer", "broken_rope", "broken_scale"])
def test_broken_servers_fail(reference, variant):
    res = _gate_against(reference, variant)
    assert not res.passed
    assert res.kl_mean > 10 * res.threshold
    assert any(r.startswith("mean KL") for r in res.reasons)
    assert any("top-1 agreement" in r for r in res.reasons)


def test_threshold_is_calibrated_from_the_aa_run():
    # 'jitter' servers vary from call to call, like batch-dependent GPU kernels: the A/A run is not zero
    a, b, broken = (serve_tiny_model_in_thread(v, seed=0) for v in ("jitter", "jitter", "broken_rope"))
    try:
        th = Thresholds(kl_floor=1e-9, aa_multiplier=3.0)
        same = gate(a.base_url, b.base_url, PROMPTS, gen_tokens=16, thresholds=th)
        bad = gate(a.base_url, broken.base_url, PROMPTS, gen_tokens=16, thresholds=th)
    finally:
        for s in (a, b, broken):
            s.stop()
    aa = same.calibration["kl_mean"]
    assert aa > 1e-6
    assert math.isclose(same.threshold, 3.0 * aa, rel_tol=1e-9)
    assert same.passed, same.reasons  # the same jittery numerics: divergence of the A/A's size
    assert same.kl_mean < 2 * aa
    assert not bad.passed and bad.kl_mean > 100 * bad.threshold


def test_positive_control_that_passes_makes_the_gate_invalid(reference):
    cand = serve_tiny_model_in_thread("reference", seed=0)
    try:
        res = gate(reference.base_url, cand.base_url, PROMPTS, gen_tokens=8, positive_control_url=cand.base_url,
                   free_running=False)
    finally:
        cand.stop()
    assert not res.passed and res.calibration["positive_control"]["passed"] is True
    assert any(r.startswith("invalid: the positive control passed") for r in res.reasons)


def test_prefix_fallback_when_the_server_returns_no_prompt_logprobs():
    small = prompt_set(1, long_chars=120)
    a = serve_tiny_model_in_thread("reference", seed=0, echo_logprobs=False)
    b = serve_tiny_model_in_thread("fp8_kv", seed=0, echo_logprobs=False)
    c = serve_tiny_model_in_thread("broken_layer", seed=0, echo_logprobs=False)
    try:
        ok = gate(a.base_url, b.base_url, small, gen_tokens=8, free_running=False)
        bad = gate(a.base_url, c.base_url, small, gen_tokens=8, free_running=False)
    finally:
        for s in (a, b, c):
            s.stop()
    assert ok.method == bad.method == "prefix"
    assert ok.n_positions == 6 * 8
    assert ok.passed, ok.reasons
    assert not bad.passed and bad.kl_mean > 10 * ok.kl_mean


def test_unreachable_candidate_is_an_error_not_a_pass(reference):
    with pytest.raises(GateError, match="failed"):
        gate(reference.base_url, "http://127.0.0.1:9", ["short prompt"], gen_tokens=2, timeout_s=5)


def test_emulated_gate_measures_the_candidates_numerics():
    kw = {"prompts": PROMPTS, "gen_tokens": 16}
    spec = emulated_gate({}, {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3}, **kw)
    kv = emulated_gate({}, {"kv_cache_dtype": "fp8_e4m3"}, **kw)
    w8 = emulated_gate({}, {"quantization": "fp8"}, **kw)
    # speculative decoding with exact verification computes like the baseline: zero divergence, passes
    assert spec.passed and spec.kl_mean == 0 and spec.greedy_match == 1
    assert kv.passed and 0 < kv.kl_mean < kv.threshold
    # fp8 weights and activations perturb far more than an fp8 KV cache; this tiny model is sensitive to it
    assert w8.kl_mean > 5 * kv.kl_mean and w8.top1_agreement < kv.top1_agreement
    assert not w8.passed and any("KL" in r for r in w8.reasons)
    for res in (spec, kv, w8):
        assert res.calibration["positive_control"]["passed"] is False  # the dropped-layer control fails
    assert kv.calibration["emulated"]["candidate_numerics"] == "float32+kv-fp8-e4m3"
    assert w8.calibration["emulated"]["candidate_numerics"] == "float32+w-fp8-per_tensor+a-fp8"


def test_compare_position_tail_treatment():
    top = {"a": math.log(0.6), "b": math.log(0.3)}
    agree, kl, tv = compare_position(top, dict(top), "a", top["a"], top["a"])
    assert agree and kl == pytest.approx(0, abs=1e-12) and tv == pytest.approx(0, abs=1e-12)
    # the candidate lists 'c' instead of 'b': each side's unlisted token is imputed from its own tail
    cand = {"a": math.log(0.6), "c": math.log(0.3)}
    agree, kl, tv = compare_position(top, cand, "a", top["a"], cand["a"])
    # union {a, b, c} + rest: ref = [.6, .3, .1, 0] (c imputed as its 0.1 unlisted mass), cand = [.6, .1, .3, 0]
    assert agree and tv == pytest.approx(0.2) and kl == pytest.approx(0.2 * math.log(3))
    flipped = {"b": math.log(0.6), "a": math.log(0.3)}
    agree, kl, tv = compare_position(top, flipped, "a", top["a"], flipped["a"])
    assert not agree and tv == pytest.approx(0.3, abs=1e-9)


def test_prompt_set_is_fixed_and_versioned():
    a, b = prompt_set(2), prompt_set(2)
    assert a.hash == b.hash and [p.text for p in a.prompts] == [p.text for p in b.prompts]
    assert prompt_set(3).hash != a.hash and len(prompt_set(3)) == 18
    assert {p.bucket for p in a.prompts} == {"prose", "multilingual", "code", "json", "chat", "long"}
    with pytest.raises(ValueError, match="unknown prompt set version"):
        prompt_set(2, version="v0")


def test_tiny_server_chat_logprobs_and_token_id_prompts(reference):
    import requests

    chat = requests.post(reference.base_url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
        "logprobs": True, "top_logprobs": 2}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert content[0]["logprob"] == max(t["logprob"] for t in content[0]["top_logprobs"])  # greedy took the top
    ids = requests.post(reference.base_url + "/v1/completions", timeout=30, json={
        "prompt": [104, 105, 33], "max_tokens": 0, "echo": True, "logprobs": 1}).json()
    assert ids["choices"][0]["text"] == "hi!" and ids["usage"]["prompt_tokens"] == 3
    lp = ids["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and all(x < 0 for x in lp["token_logprobs"][1:])
    bad = requests.post(reference.base_url + "/v1/completions", timeout=30, json={"prompt": [1, 999]})
    assert bad.status_code == 400 and "token ids must be in" in bad.json()["message"]
