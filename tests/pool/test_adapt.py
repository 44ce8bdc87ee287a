"""Adapting a pool to an endpoint's limits: what is dropped, trimmed or stripped is counted, never silent."""
from __future__ import annotations

import pytest

from autoresearch_dagster.loadgen.schedule import build_schedule
from autoresearch_dagster.pool.adapt import AdaptedPool, PoolLimits, adapt_body, limits_from_options
from autoresearch_dagster.spec import EndpointSpec, SpecError
from tests.loadgen.helpers import FakePool, FakePoolRequest

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def _pool() -> FakePool:
    rows = [FakePoolRequest(id="short", arrival_s=0.0, messages=[{"role": "user", "content": "a"}], prompt_tokens=100,
                            output_tokens=50),
            FakePoolRequest(id="long", arrival_s=1.0, messages=[{"role": "user", "content": "b"}], prompt_tokens=990,
                            output_tokens=10),
            FakePoolRequest(id="near", arrival_s=2.0, messages=[{"role": "user", "content": "c"}], prompt_tokens=900,
                            output_tokens=300),
            FakePoolRequest(id="tool", arrival_s=3.0, messages=[{"role": "user", "content": "d"}], prompt_tokens=10,
                            tools=TOOLS, tool_choice="auto", sampling={"seed": 7, "temperature": 0.5}),
            FakePoolRequest(id="train", arrival_s=4.0, messages=[{"role": "user", "content": "e"}], prompt_tokens=5000,
                            split="training")]
    pool = FakePool(rows)
    pool.content_hash = "abc"
    return pool


def test_drop_trim_strip_are_counted():
    pool = AdaptedPool(_pool(), PoolLimits(max_model_len=1000, strip_tools=True, strip_sampling=("seed",),
                                           margin=0.02))
    served = {r.id: r for r in pool.iter_requests("serving")}
    assert set(served) == {"short", "near", "tool"} and len(pool) == 3
    assert served["near"].output_tokens == 980 - 900 and served["short"].output_tokens == 50
    assert served["tool"].tools is None and served["tool"].tool_choice is None
    assert served["tool"].sampling == {"temperature": 0.5}
    a = pool.meta["adaptation"]
    assert (a["requests"], a["dropped_over_context"], a["trimmed_output"], a["tools_stripped"],
            a["sampling_stripped"]) == (5, 2, 1, 1, 1)
    assert a["dropped_ids"] == ["long", "train"]
    assert pool.content_hash.startswith("abc+adapted-") and pool.content_hash != _pool().content_hash
    assert "2 dropped over context, 1 trimmed output, 1 tools stripped, 1 sampling stripped of 5" in pool.summary()
    body = build_schedule(pool, [0.0, 1.0, 2.0], model="m", seed=0)
    assert all("tools" not in s.body and "tool_choice" not in s.body and "seed" not in s.body for s in body)
    assert [s.body["max_tokens"] for s in body] == [50, 80, 4]


def test_adapt_body_strips_what_the_limits_name():
    body = {"messages": [], "tools": TOOLS, "tool_choice": "auto", "seed": 1, "temperature": 0.2}
    assert adapt_body(body, PoolLimits(strip_tools=True, strip_sampling=("seed",))) == (
        {"messages": [], "temperature": 0.2}, ["tools_stripped", "sampling_stripped"])
    assert adapt_body(body, PoolLimits()) == (body, [])
    assert "tools" in body  # not modified in place


def test_nothing_left_is_an_error():
    with pytest.raises(SpecError, match="leaves no serving request"):
        AdaptedPool(_pool(), PoolLimits(max_model_len=16, margin=0.5))


def _spec(opts, config=None) -> EndpointSpec:
    return EndpointSpec.model_validate({"name": "t", "model": "m", "hardware": {"gpu": "cpu"}, "sla": "ttft_p99<=1s",
                                        "engine": "vllm", "server_config": config or {},
                                        "engine_options": {"adapt_pool": opts} if opts is not None else {}})


def test_limits_from_the_endpoint():
    assert limits_from_options(_spec(None)) is None
    assert limits_from_options(_spec({"strip_tools": True, "strip_sampling": ["seed"]}, {"max_model_len": 4096})) == \
        PoolLimits(max_model_len=4096, strip_tools=True, strip_sampling=("seed",))
    with pytest.raises(SpecError, match="strip_sampling must be a list"):
        limits_from_options(_spec({"strip_sampling": "seed"}))
    assert limits_from_options(_spec({"max_model_len": 2048, "margin": 0.1})).max_model_len == 2048
    with pytest.raises(SpecError, match="adapt_pool takes"):
        limits_from_options(_spec({"drop_everything": True}))
    with pytest.raises(SpecError, match="margin must be within"):
        limits_from_options(_spec({"margin": 0.9}))


def test_a_capped_output_is_counted_and_an_adapted_pool_is_written_as_its_own(tmp_path):
    from tests.agents.helpers import long_prompt_pool
    from autoresearch_dagster.pool.adapt import write_adapted

    capped = AdaptedPool(_pool(), PoolLimits(max_output_tokens=40))
    assert {r.id: r.output_tokens for r in capped.iter_requests("serving")}["short"] == 40
    assert capped.meta["adaptation"]["capped_output"] == 2 and "2 capped output" in capped.summary()
    assert "max_output_tokens=40" in capped.summary()
    source = long_prompt_pool(tmp_path / "src", n=30)
    out = write_adapted(source, PoolLimits(max_output_tokens=150), tmp_path / "adapted")
    outs = [r.output_tokens for r in out.iter_requests(None)]
    assert len(outs) == 30 and max(outs) == 150
    assert out.meta["adapted_from"] == source.content_hash and out.content_hash != source.content_hash
    assert out.meta["adaptation"]["capped_output"] == sum(r.output_tokens > 150 for r in source.iter_requests(None))


def test_max_output_tokens_from_the_endpoint():
    spec = EndpointSpec(name="x", model="llama-3.1-8b", hardware={"gpu": "H100"}, sla="ttft_p99<=1s",
                        engine_options={"adapt_pool": {"max_output_tokens": 256}})
    assert limits_from_options(spec).max_output_tokens == 256
    with pytest.raises(SpecError, match="max_output_tokens must be an integer"):
        limits_from_options(spec.model_copy(update={"engine_options": {"adapt_pool": {"max_output_tokens": 0}}}))
