"""EngineCore contract: config resolution, errors, determinism, events, dp replicas, profiles, the engine."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.profile import write_trace
from autoresearch_dagster.emulator.sim import simulate
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.loadgen.records import ScheduledRequest
from autoresearch_dagster.spec import SpecError

from .helpers import core, endpoint, reqs


def test_unknown_knob_is_an_error():
    with pytest.raises(SpecError, match="unknown server knob 'num_continuous_decode_steps'"):
        core({"num_continuous_decode_steps": 4})
    with pytest.raises(SpecError, match="schedule_policy"):
        core({"schedule_policy": "priority"})


def test_resolution_follows_sglang_defaults():
    k = core({}).resolved_config()
    assert k["chunked_prefill_size"] == 8192  # H200: < 160 GiB
    assert k["cuda_graph_max_bs_decode"] == 256
    assert k["prefill_decode_interval"] == 0 and k["page_size"] == 1
    assert 0.85 < k["mem_fraction_static"] < 0.95
    assert set(k) >= {"max_running_requests", "speculative_algorithm", "stream_interval", "dp_size"}
    b200 = core({}, model="llama-3.1-8b", gpu_name="B200").resolved_config()
    assert b200["chunked_prefill_size"] == 16384 and b200["cuda_graph_max_bs_decode"] == 512
    capped = core({"max_running_requests": 64}).resolved_config()
    assert capped["cuda_graph_max_bs_decode"] == 64
    spec = core({"speculative_algorithm": "EAGLE"}, model="llama-3.1-8b", gpu_name="H100").resolved_config()
    assert (spec["speculative_num_steps"], spec["speculative_eagle_topk"], spec["speculative_num_draft_tokens"]) == (5, 4, 8)
    with pytest.raises(SpecError, match="does not fit"):
        core({}, model="qwen3-235b-a22b")
    assert core({"tp_size": 8}, model="qwen3-235b-a22b", gpus=8).resolved.max_total_num_tokens > 100_000
    with pytest.raises(SpecError, match="exceeds"):
        core({"tp_size": 2})


def test_same_seed_same_result_different_seed_differs():
    work = reqs(80, 1500, 200, every=0.05)
    noisy = NoiseSettings()
    a = simulate(core({}, seed=3, noise=noisy), work)
    b = simulate(core({}, seed=3, noise=noisy), work)
    c = simulate(core({}, seed=4, noise=noisy), work)
    ends = lambda res: [r.end_s for r in sorted(res.requests, key=lambda r: r.rid)]  # noqa: E731
    assert ends(a) == ends(b)
    assert ends(a) != ends(c)


def test_next_step_events_account_for_every_token():
    c = core({"stream_interval": 1})
    for r in reqs(5, 700, 30, every=0.0):
        c.add_request(r, 0.0)
    now, tokens, finished = 0.0, {}, set()
    while (step := c.next_step(now)) is not None:
        assert step.start_s >= now - 1e-12 and step.duration_s > 0
        for ev in step.events:
            tokens[ev.rid] = tokens.get(ev.rid, 0) + ev.n_tokens
            if ev.finished:
                finished.add(ev.rid)
        now = step.end_s
    assert tokens == {f"u{i}": 30 for i in range(5)} and len(finished) == 5
    assert c.metrics()["sglang:num_running_reqs"] == 0 and c.metrics()["sglang:token_usage"] == 0


def test_abort_frees_the_request():
    c = core({})
    for r in reqs(3, 500, 400):
        c.add_request(r, 0.0)
    c.next_step(0.0)
    c.abort("u1")
    done = {r.rid: r.status for r in c.pop_finished()}
    assert done == {"u1": "error"}
    c.drain()
    assert {r.rid for r in c.pop_finished()} == {"u0", "u2"}
    assert c.metrics()["sglang:num_aborted_requests_total"] == 1


def test_dp_replicas_share_the_load_round_robin():
    work = reqs(400, 1000, 300, every=0.01)
    one = simulate(core({}, gpus=2), work)
    two = simulate(core({"dp_size": 2}, gpus=2), work)
    span = lambda res: res.end_s - res.start_s  # noqa: E731
    assert span(two) < 0.7 * span(one)
    assert two.final_metrics["sglang:max_total_num_tokens"] == 2 * one.final_metrics["sglang:max_total_num_tokens"]


def test_stream_interval_coarsens_client_itl():
    res = simulate(core({"stream_interval": 4}), reqs(2, 300, 41))
    r = res.requests[0]
    assert len(r.token_times) == 41
    assert len(r.itl_s(4)) == 11  # chunks at tokens 1, 4, 8, ..., 40 and the last one (41)
    assert np.isclose(r.itl_s(4).sum(), r.token_times[-1] - r.token_times[0])


def test_profile_is_a_pytorch_shaped_chrome_trace(tmp_path):
    res = simulate(core({}), reqs(40, 3000, 60, every=0.1), profile_window=(0.5, 2.5))
    trace = res.profile
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all(e["ph"] == "X" and "ts" in e and e["dur"] > 0 for e in kernels)
    assert {e["pid"] for e in kernels} == {0}
    names = " ".join({e["name"] for e in kernels})
    for fragment in ("flash_fwd", "fused_moe_kernel", "nvjet", "Sampling"):
        assert fragment in names
    assert any(e.get("cat") == "user_annotation" and "forward_extend" in e["name"] for e in trace["traceEvents"])
    path = write_trace(trace, tmp_path / "123-TP-0.trace.json.gz")
    assert json.loads(gzip.decompress(path.read_bytes()))["traceEvents"][0]["ph"] == "M"
    from autoresearch_dagster.diagnose.profile import parse_profile
    summary = parse_profile(str(tmp_path))
    assert summary.has_gpu
    assert summary.breakdown_share["gemm_moe"] > 0.3 and summary.breakdown_share["attention"] > 0.02
    assert summary.n_steps.get("decode", 0) > 0 and summary.n_steps.get("prefill", 0) > 0


def test_virtual_engine_runs_steps_and_keeps_cache_until_flush(tmp_path):
    eng = EmulatorEngine(endpoint(), noise=NoiseSettings.off())
    dep = eng.deploy({}, seed=0)
    sched = [ScheduledRequest(f"q{i}", i * 0.1, "chat", {}, 2048, 50, [1000 + b for b in range(32)], 64) for i in range(4)]
    first = dep.run_step(sched, step_id="a", timeout_s=60)
    assert [r.status for r in first.records] == ["ok"] * 4
    assert first.records[0].cached_tokens == 0 and first.records[1].cached_tokens == 2047
    assert all(len(r.itl_s) == 49 and r.ttft_s > 0 for r in first.records)
    assert first.engine_timeseries and "sglang:num_running_reqs" in first.engine_timeseries[0]
    again = dep.run_step([ScheduledRequest("z", 0.0, "chat", {}, 2048, 5, [1000 + b for b in range(32)], 64)],
                         step_id="b", timeout_s=60)
    assert again.records[0].cached_tokens == 2047
    assert dep.flush_cache() is True
    cold = dep.run_step([ScheduledRequest("y", 0.0, "chat", {}, 2048, 5, [1000 + b for b in range(32)], 64)],
                        step_id="c", timeout_s=60)
    assert cold.records[0].cached_tokens == 0
    info = dep.server_info()
    assert info["version"].startswith("emulator-") and info["max_total_num_tokens"] > 0
    assert "sglang:num_running_reqs" in dep.metrics_text()
    dep.start_profile(str(tmp_path))
    dep.run_step(sched, step_id="d", timeout_s=60)
    files = dep.stop_profile()
    assert [p.endswith("-TP-0.trace.json.gz") for p in files] == [True]


def test_requests_past_the_timeout_are_reported_as_timeouts():
    dep = EmulatorEngine(endpoint(), noise=NoiseSettings.off()).deploy({}, seed=0)
    sched = [ScheduledRequest("long", 0.0, "chat", {}, 500, 4000, [], 64)]
    out = dep.run_step(sched, step_id="t", timeout_s=2.0)
    assert out.records[0].status == "timeout" and out.records[0].error_class == "timeout"


def test_a_request_larger_than_the_kv_pool_is_rejected_with_an_event():
    c = core({"mem_fraction_static": 0.36})  # a few thousand KV tokens after the weights
    cap = c.resolved.max_total_num_tokens
    c.add_request(reqs(1, cap + 10, 5, prefix="big")[0], 0.0)
    step = c.next_step(0.0)
    assert step.kind == "reject"
    assert [(e.rid, e.finished, e.error) for e in step.events] == [("big0", True, "request does not fit in the KV cache")]
    assert c.next_step(0.0) is None


def test_the_emulators_release_changes_with_its_cost_model_as_an_engine_release_would(monkeypatch):
    from autoresearch_dagster.emulator import cost
    from autoresearch_dagster.emulator.core import emulator_version
    from autoresearch_dagster.memory import Conditions

    now = emulator_version()
    assert now.startswith("emulator-") and f"+cm{cost.COST_MODEL_VERSION}." in now
    monkeypatch.setattr(cost, "COST_MODEL_VERSION", cost.COST_MODEL_VERSION + 1)  # a new mechanism lands
    later = emulator_version()
    assert later != now
    cond = dict(engine="emulator", model="llama-3.1-8b", gpu="H100", gpus=1, pool_hash="p", traits={})
    # a config tried under the old cost model is not taken as tried under the new one
    assert Conditions(engine_version=now, **cond).key() != Conditions(engine_version=later, **cond).key()
