"""Workload, metrics and load-curve analysis on small inputs with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from autoresearch_dagster.diagnose.curve import analyze_curve
from autoresearch_dagster.diagnose.metrics import analyze_timeseries
from autoresearch_dagster.loadgen.prometheus import snapshot
from autoresearch_dagster.pool.workload import burstiness, prefix_reuse, workload_stats
from autoresearch_dagster.pool.schema import PoolRequest
from autoresearch_dagster.spec import SLA

from ..loadgen.helpers import METRICS_TEXT



def _series(n, queue, running, usage, t_step=1.0, cached_per=0.0, prompt_per=100.0, retract_per=0.0):
    return [{"t": i * t_step, "sglang:num_queue_reqs": queue(i), "sglang:num_running_reqs": running(i),
             "sglang:token_usage": usage(i), "sglang:cached_tokens_total": cached_per * i,
             "sglang:prompt_tokens_total": prompt_per * i, "sglang:num_retracted_reqs_total": retract_per * i}
            for i in range(n)]


def test_timeseries_queue_growth_and_caps():
    rows = _series(30, queue=lambda i: 2 * i, running=lambda i: 64, usage=lambda i: 0.4, cached_per=25.0)
    st = analyze_timeseries(rows, {"max_running_requests": 64, "cuda_graph_max_bs_decode": 32})
    assert st.queue_slope_per_s == pytest.approx(2.0)
    assert st.share_at_running_cap == 1.0 and st.share_above_graph_bs == 1.0
    assert st.at_cap_when_queued == 1.0 and st.usage_when_queued == pytest.approx(0.4)
    assert st.cache_hit_rate == pytest.approx(0.25)
    assert st.retractions == 0.0
    calm = analyze_timeseries(_series(30, lambda i: 0, lambda i: 8, lambda i: 0.98, retract_per=2.0),
                              {"max_running_requests": 64, "cuda_graph_max_bs_decode": 32})
    assert calm.queue_slope_per_s == pytest.approx(0.0) and calm.share_at_running_cap == 0.0
    assert calm.share_above_graph_bs == 0.0 and calm.token_usage_max == pytest.approx(0.98)
    assert calm.retractions == pytest.approx(58.0)
    # Waiting requests while the batch is small and memory full: not the cap.
    mem = analyze_timeseries(_series(20, lambda i: 3, lambda i: 10, lambda i: 0.99), {"max_running_requests": 64})
    assert mem.at_cap_when_queued == 0.0 and mem.usage_when_queued == pytest.approx(0.99)
    # Scraped texts work the same way as dicts.
    from_text = analyze_timeseries([METRICS_TEXT, METRICS_TEXT])
    assert from_text.queue_mean == 10.0 and from_text.token_usage_max == pytest.approx(0.8)


def _req(i, arrival, prompt, output, hashes, conv=None, tools=None, rf=None):
    return PoolRequest(id=str(i), arrival_s=arrival, conversation_id=conv, turn=None, api="chat",
                       messages=[{"role": "user", "content": "x"}], prompt=None, tools=tools, tool_choice=None,
                       response_format=rf, sampling={}, prompt_tokens=prompt, output_tokens=output,
                       block_hashes=hashes, block_tokens=64, split="serving")


def test_prefix_reuse_infinite_cache():
    # A 4-block system prompt shared by 10 requests, each with 2 unique blocks.
    reqs = [_req(i, float(i), 6 * 64, 100, [1, 2, 3, 4, 1000 + 2 * i, 1001 + 2 * i]) for i in range(10)]
    hit, top = prefix_reuse(reqs)
    assert hit == pytest.approx(9 * 4 / (10 * 6))
    assert top[0].prefix_tokens == 256 and top[0].requests == 9 and top[0].tokens_saved == 9 * 256
    unique = [_req(i, float(i), 384, 100, [10 * i + k for k in range(6)]) for i in range(10)]
    assert prefix_reuse(unique)[0] == 0.0


def test_burstiness_poisson_vs_bursts():
    rng = np.random.default_rng(0)
    poisson = np.cumsum(rng.exponential(1.0, 2000))
    cv, disp, _ = burstiness(poisson)
    assert cv == pytest.approx(1.0, abs=0.1) and disp == pytest.approx(1.0, abs=0.3)
    bursts = np.concatenate([k * 100.0 + rng.uniform(0, 2.0, 100) for k in range(20)])
    cvb, dispb, _ = burstiness(bursts)
    assert cvb > 3 and dispb > 10


def test_workload_stats_shares_and_turns():
    reqs = [_req(i, float(i), 8000 if i % 4 == 0 else 500, 20 if i % 2 else 400, [i],
                 conv=f"c{i // 3}", tools=[{"type": "function"}] if i % 5 == 0 else None,
                 rf={"type": "json_object"} if i % 10 == 0 else None) for i in range(30)]
    w = workload_stats(reqs)
    assert w.n_requests == 30 and w.share_long_prompts == pytest.approx(8 / 30)
    assert w.share_short_outputs == pytest.approx(0.5)
    assert w.share_tools == pytest.approx(6 / 30) and w.share_structured == pytest.approx(3 / 30)
    assert w.conversations == 10 and w.turns_mean == 3 and w.turns_max == 3
    assert w.prompt_tokens["max"] == 8000
    with pytest.raises(ValueError, match="empty"):
        workload_stats([])


def _step(rate, ttft50, tpot50, ok, failed=(), itl50=20.0, itl99=40.0, queue=False):
    return {"step_id": f"s{rate}", "rate_rps": rate, "offered_rps": rate, "achieved_rps": rate if ok else rate * 0.8,
            "ttft_ms": {"p50": ttft50, "p95": ttft50 * 2, "p99": ttft50 * 3},
            "tpot_ms": {"p50": tpot50, "p95": tpot50 * 1.2, "p99": tpot50 * 1.5},
            "itl_ms": {"p50": itl50, "p95": itl99, "p99": itl99}, "e2e_ms": {"p50": 1.0, "p95": 1.0, "p99": 1.0},
            "error_rate": 0.0, "meets_sla": ok, "failed_terms": list(failed), "queue_growth": queue, "valid": True}


def test_curve_queueing_vs_per_token():
    sla = SLA.parse("ttft_p99<=3000ms,tpot_p99<=60ms")
    queueing = {"capacity_rps": 4.0, "steps": [_step(1, 200, 20, True), _step(2, 250, 21, True),
                                               _step(4, 600, 22, True),
                                               _step(8, 9000, 24, False, ["ttft_p99<=3000ms"], queue=True)]}
    a = analyze_curve(queueing, sla)
    assert a.knee_rps == 4 and a.break_rps == 8 and a.first_broken == ["ttft"]
    assert a.regime == "queueing" and a.ttft_growth == pytest.approx(45.0) and a.queue_growth
    assert a.headroom_low["ttft"] == pytest.approx(600 / 3000)
    per_token = {"capacity_rps": 2.0, "steps": [_step(1, 200, 20, True), _step(2, 260, 35, True),
                                                _step(4, 300, 70, False, ["tpot_p99<=60ms"], itl99=400.0)]}
    b = analyze_curve(per_token, sla)
    assert b.regime == "per_token" and b.first_broken == ["tpot"] and b.itl_tail_ratio == pytest.approx(20.0)
    assert analyze_curve({"capacity_rps": None, "steps": []}).regime == "none"


def test_emulator_metrics_exposition_round_trips():
    emu = pytest.importorskip("autoresearch_dagster.engines.emulator")
    from autoresearch_dagster.spec import EndpointSpec

    ep = EndpointSpec(name="m", model="llama-3.1-8b", hardware={"gpu": "H100", "count": 1},
                      sla="ttft_p99<=1000ms", engine="emulator")
    dep = emu.EmulatorEngine(ep).deploy({"max_running_requests": 32})
    snap = snapshot(dep.metrics_text())
    assert snap["sglang:num_running_reqs"] == 0.0 and "sglang:token_usage" in snap
    cfg = dep.server_info()
    st = analyze_timeseries([dep.metrics_text()], cfg)
    assert st.max_running_requests == 32 and st.cuda_graph_max_bs == cfg["cuda_graph_max_bs_decode"]


def test_resolved_knobs_prefer_the_servers_values():
    from autoresearch_dagster.diagnose.report import resolved_knobs

    info = {"max_running_requests": None, "cuda_graph_max_bs_decode": 256, "tp_size": 1,
            "internal_states": [{"effective_max_running_requests_per_dp": 1024}], "model_path": "x"}
    r = resolved_knobs(info, {"chunked_prefill_size": 4096})
    assert r["max_running_requests"] == 1024 and r["cuda_graph_max_bs_decode"] == 256
    assert r["chunked_prefill_size"] == 4096 and "model_path" not in r
