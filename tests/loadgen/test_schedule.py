"""Arrival schedules (rate, CV, burstiness, production shape) and faithful request rebuilding."""
import numpy as np
import pytest

from autoresearch_dagster.loadgen.schedule import build_schedule, poisson_offsets, shape_offsets
from .helpers import FakePool, FakePoolRequest


def _cv(offsets):
    gaps = np.diff(offsets)
    return gaps.std() / gaps.mean()


def test_poisson_rate_and_cv():
    offs = poisson_offsets(200.0, 50.0, seed=1)
    n = len(offs)
    assert abs(n - 10_000) < 4 * np.sqrt(10_000)  # Poisson count within 4 sigma
    assert all(0 <= a < b < 50.0 for a, b in zip(offs, offs[1:]))
    assert 0.95 < _cv(offs) < 1.05  # exponential gaps: CV 1


def test_gamma_burstiness_raises_cv_and_keeps_rate():
    bursty = poisson_offsets(200.0, 50.0, seed=2, burstiness=0.25)
    smooth = poisson_offsets(200.0, 50.0, seed=2, burstiness=4.0)
    assert 1.8 < _cv(bursty) < 2.2  # CV = 1/sqrt(shape) = 2
    assert 0.45 < _cv(smooth) < 0.55
    for offs in (bursty, smooth):
        assert abs(len(offs) / 50.0 - 200.0) / 200.0 < 0.06


def test_bad_rates_are_rejected():
    with pytest.raises(ValueError):
        poisson_offsets(0, 10, seed=0)
    with pytest.raises(ValueError):
        poisson_offsets(1, 10, seed=0, burstiness=0)


def _shape_pool():
    # original timeline: 10 req in [0,60), 100 in [60,120), 30 in [120,180)
    rng = np.random.default_rng(0)
    arr = np.concatenate([rng.uniform(0, 60, 10), rng.uniform(60, 120, 100), rng.uniform(120, 180, 30)])
    arr[0] = 0.0  # intervals are counted from the first arrival
    return FakePool([FakePoolRequest(id=f"r{i}", arrival_s=float(a) + 1000.0,
                                     messages=[{"role": "user", "content": "hi"}]) for i, a in enumerate(arr)])


def test_shape_follows_per_interval_rates_with_speedup():
    pool = _shape_pool()
    offs = np.asarray(shape_offsets(pool, speedup=4.0, interval_s=60.0, seed=3))
    counts = np.bincount((offs // 15.0).astype(int), minlength=3)  # replay intervals are 60/4 = 15 s
    assert counts.tolist() == [10, 100, 30]
    assert offs.max() < 45.0
    offs2 = np.asarray(shape_offsets(pool, speedup=4.0, interval_s=60.0, seed=4))
    assert not np.allclose(np.sort(offs), np.sort(offs2))  # randomized within intervals
    sched = build_schedule(pool, offs.tolist(), model="m", seed=0, aligned=True)
    assert [s.send_offset_s for s in sched] == sorted(offs.tolist())


def test_rebuild_keeps_tools_response_format_sampling_and_pins_output():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    req = FakePoolRequest(id="a", arrival_s=0.0, messages=[{"role": "user", "content": "x"}], tools=tools,
                          tool_choice="auto", response_format={"type": "json_object"},
                          sampling={"temperature": 0.7, "top_p": 0.9, "stop": ["\n"], "seed": 5, "logprobs": True,
                                    "top_logprobs": 2, "max_tokens": 999},
                          output_tokens=37)
    comp = FakePoolRequest(id="b", arrival_s=1.0, api="completions", prompt="p", sampling={"n": 2}, output_tokens=5)
    sched = build_schedule(FakePool([req, comp]), [0.0, 0.5], model="served", seed=9)
    chat, cmp = sched[0].body, sched[1].body
    assert chat["tools"] == tools and chat["tool_choice"] == "auto"
    assert chat["response_format"] == {"type": "json_object"}
    assert (chat["temperature"], chat["top_p"], chat["stop"], chat["seed"], chat["top_logprobs"]) == (0.7, 0.9, ["\n"], 5, 2)
    assert chat["max_tokens"] == 37 and chat["max_completion_tokens"] == 37 and chat["ignore_eos"] is True
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True} and chat["model"] == "served"
    assert cmp["prompt"] == "p" and cmp["n"] == 2 and cmp["max_tokens"] == 5 and "max_completion_tokens" not in cmp
    assert sched[0].api == "chat" and sched[1].api == "completions" and sched[0].output_tokens == 37
    unpinned = build_schedule(FakePool([req]), [0.0], model="m", seed=0, pin_output=False)[0].body
    assert unpinned["max_tokens"] == 999 and "ignore_eos" not in unpinned


def test_rebuild_through_the_real_pool_module(tmp_path):
    from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool
    rows = [PoolRequest(id=f"q{i}", arrival_s=float(i), conversation_id=None, turn=None, api="chat",
                        messages=[{"role": "user", "content": f"hello {i}"}], prompt=None,
                        tools=[{"type": "function", "function": {"name": "g"}}], tool_choice="required",
                        response_format={"type": "json_object"}, sampling={"temperature": 0.2},
                        prompt_tokens=3, output_tokens=11, block_hashes=[1, 2], block_tokens=64, split="serving")
            for i in range(3)]
    pool = read_pool(write_pool(rows, tmp_path / "pool"))
    sched = build_schedule(pool, [0.0, 0.1, 0.2, 0.3], model="m", seed=1, start_index=2)
    assert [s.pool_row for s in sched] == [2, 0, 1, 2]  # wraps around the pool
    b = sched[0].body
    assert b["tool_choice"] == "required" and b["temperature"] == 0.2 and b["max_completion_tokens"] == 11
    assert len({s.request_id for s in sched}) == 4
