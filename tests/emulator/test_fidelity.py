"""The structural mechanisms of the cost model (overlap scheduler, CUDA-graph padding, per-request decode cost,
fp8 KV reads, MLA attention, fixed request latency) and the validation table / fit (issue 13)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from autoresearch_dagster.emulator.catalog import gpu, model_card
from autoresearch_dagster.emulator.cost import CostModel, Efficiency, StepCost, cuda_graph_batch_sizes
from autoresearch_dagster.emulator.sim import simulate, simulate_closed_loop
from autoresearch_dagster.emulator.validation import (
    Point, Workload, fit, load_table, metrics_of, point_requests, predict, run_point, sharegpt_lengths, split_of)
from autoresearch_dagster.spec import SpecError
from autoresearch_dagster.emulator.core import EngineCore
from .helpers import QUIET, core, reqs

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "emulator_validation.json"


def _engine(eff: Efficiency) -> EngineCore:
    return EngineCore(model_card("qwen3-8b"), gpu("H100"), 1, {}, noise=QUIET, efficiency=eff)


def _cm(model="qwen3-8b", hw="H100", **kw) -> CostModel:
    return CostModel(model_card(model), gpu(hw), tp=1, fp8_weights=False, kv_bytes=2.0, **kw)


# ------------------------------------------------------------------ overlap scheduler

def test_overlap_hides_cpu_behind_the_gpu_and_disable_adds_it_back():
    on = StepCost(gemm_s=0.004, cpu_s=0.001, overlap=True)
    off = StepCost(gemm_s=0.004, cpu_s=0.001, overlap=False)
    assert on.total_s == pytest.approx(0.004) and off.total_s == pytest.approx(0.005)
    assert StepCost(gemm_s=0.001, cpu_s=0.003, overlap=True).total_s == pytest.approx(0.003)  # CPU-bound step
    # a whole run: the knob turns the overlap off, and the same decode takes longer
    work = reqs(8, 200, 200, prefix="o")
    eff = Efficiency(step_overhead_s=0.0009)  # a scheduler step of 0.9 ms (the mechanism, not the fitted default)
    t = {flag: simulate(EngineCore(model_card("qwen3-8b"), gpu("H100"), 1, {"disable_overlap_schedule": flag},
                                   noise=QUIET, efficiency=eff), work).end_s for flag in (False, True)}
    assert t[True] > 1.08 * t[False]


def test_speculative_steps_run_without_the_overlap_scheduler():
    c = core({"speculative_algorithm": "EAGLE"}, model="llama-3.1-8b", gpu_name="H100")
    assert not c.cost.step(decode_reqs=4, decode_width=8, decode_ctx=4000, draft_steps=5).overlap
    assert c.cost.step(decode_reqs=4, decode_ctx=4000).overlap


# ------------------------------------------------------------------ CUDA graphs

def test_captured_sizes_follow_sglang_and_padding_prices_the_padded_batch():
    sizes = cuda_graph_batch_sizes(512)
    assert sizes[:6] == (1, 2, 4, 8, 12, 16) and 264 not in sizes and 272 in sizes and sizes[-1] == 512
    assert cuda_graph_batch_sizes(20) == (1, 2, 4, 8, 12, 16, 20)  # the max itself is captured
    cm = _cm(cuda_graph_max_bs=256)
    assert cm.graph_batch(9) == 12 and cm.graph_batch(256) == 256 and cm.graph_batch(257) is None
    # a compute-bound shape shows the padding: 130 requests cost what the 136-graph costs
    big = CostModel(model_card("qwen3-8b"), gpu("A100"), tp=1, fp8_weights=False, kv_bytes=2.0)
    s130, s136 = big.step(decode_reqs=130, decode_ctx=130), big.step(decode_reqs=136, decode_ctx=136)
    assert s130.gemm_s == pytest.approx(s136.gemm_s) and s130.launch_s == 0
    assert big.step(decode_reqs=300, decode_ctx=300).launch_s > 0  # above the largest graph: eager


def test_disable_cuda_graph_makes_small_batch_decode_launch_bound():
    work = reqs(2, 200, 300, prefix="c")
    run = lambda flag: simulate(core({"disable_cuda_graph": flag}, model="llama-3.1-8b", gpu_name="B200"), work)  # noqa: E731
    graph, eager = run(False), run(True)
    assert eager.final_metrics["sglang:cuda_graph_passes_total"] == 0
    assert graph.final_metrics["sglang:eager_passes_total"] == 0
    tpot = lambda res: np.median([(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in res.requests])  # noqa: E731
    launches = model_card("llama-3.1-8b").layers * Efficiency().eager_layer_s
    assert tpot(eager) >= launches > tpot(graph)  # eager: bound by Python's launches, which the graph replay skips
    assert tpot(eager) > 1.1 * tpot(graph)


# ------------------------------------------------------------------ per-request decode cost, fp8 KV, MLA

def test_decode_step_grows_with_the_running_batch_beyond_kv_bytes():
    eff = Efficiency()
    cm = _cm(eff=eff)
    m = model_card("qwen3-8b")
    one, eight = cm.step(decode_reqs=1, decode_ctx=500), cm.step(decode_reqs=8, decode_ctx=8 * 500)
    kv = 7 * 500 * m.kv_bytes_per_token(2.0) / (gpu("H100").hbm_bw * eff.kv_mbu * gpu("H100").mbu_scale)
    assert eight.attn_s - one.attn_s == pytest.approx(kv + 7 * m.layers * eff.decode_req_layer_s, rel=0.05)


def test_fp8_kv_halves_the_kv_bytes_decode_attention_reads():
    m, hw = model_card("qwen3-8b"), gpu("H100")
    eff = Efficiency(decode_req_layer_s=0.0)
    bf16 = CostModel(m, hw, tp=1, fp8_weights=False, kv_bytes=2.0, eff=eff)
    fp8 = CostModel(m, hw, tp=1, fp8_weights=False, kv_bytes=1.0, eff=eff)
    shape = dict(decode_reqs=64, decode_ctx=64 * 4000)
    assert fp8.step(**shape).attn_s == pytest.approx(0.5 * bf16.step(**shape).attn_s, rel=0.01)
    assert fp8.step(**shape).gemm_s == bf16.step(**shape).gemm_s  # weights untouched


def test_mla_decode_attention_runs_absorbed_over_the_latent():
    from autoresearch_dagster.emulator.card import ModelCard
    mla = ModelCard("mla", layers=4, hidden=1024, heads=16, kv_heads=16, head_dim=192, ffn=2048, vocab=1000,
                    kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128)
    hw = gpu("H100")
    eff = Efficiency(attn_mfu=0.5, kv_mbu=1e9, decode_req_layer_s=0.0)  # make attention FLOP-bound
    cm = CostModel(mla, hw, tp=2, fp8_weights=False, kv_bytes=2.0, eff=eff)
    pairs = 1000
    step = cm.step(decode_reqs=1, decode_ctx=pairs)
    per_pair = (16 / 2) * (4 * 512 + 2 * 64)  # heads per rank x absorbed QK over latent+rope and PV over latent
    assert step.attn_s == pytest.approx(mla.layers * pairs * per_pair / (hw.bf16_flops * 0.5), rel=0.01)
    pre = cm.step(prefill_tokens=100, prefill_seqs=1, prefill_attn_work=100 * 50)
    assert pre.attn_s == pytest.approx(mla.layers * 5000 * (16 / 2) * 2 * (192 + 128) / (hw.bf16_flops * 0.5), rel=0.01)


# ------------------------------------------------------------------ fixed request latency

def test_request_latency_adds_to_ttft_and_e2e_not_to_token_gaps():
    base, slow = Efficiency(request_in_s=0.0, request_out_s=0.0), Efficiency(request_in_s=0.005, request_out_s=0.007)
    work = reqs(1, 300, 50, prefix="l")
    a = simulate(_engine(base), work).requests[0]
    b = simulate(_engine(slow), work).requests[0]
    assert b.ttft_s - a.ttft_s == pytest.approx(0.012, abs=1e-6)
    assert b.e2e_s - a.e2e_s == pytest.approx(0.012, abs=1e-6)
    assert np.allclose(b.itl_s(), a.itl_s())


def test_closed_loop_keeps_the_concurrency_and_waits_for_the_client():
    res = simulate_closed_loop(_engine(Efficiency(request_in_s=0.004, request_out_s=0.004)), reqs(12, 100, 20, prefix="k"), 3)
    assert len(res.requests) == 12 and all(r.status == "ok" for r in res.requests)
    starts = sorted(r.arrival_s for r in res.requests)
    ends = sorted(r.end_s for r in res.requests)
    assert starts[:3] == [0.0, 0.0, 0.0]
    assert starts[3] == pytest.approx(ends[0])  # the next prompt goes when a client has its last token
    in_flight = max(sum(1 for r in res.requests if r.arrival_s <= t < r.end_s) for t in starts)
    assert in_flight == 3
    # clients that finish together with fewer requests left than clients: each left request is sent once
    same = simulate_closed_loop(_engine(Efficiency()), reqs(5, 100, 20, prefix="s"), 4)
    assert sorted(r.rid for r in same.requests) == sorted(r.rid for r in reqs(5, 100, 20, prefix="s"))


# ------------------------------------------------------------------ the validation table and the fit

def test_the_table_is_cited_split_by_its_rule_and_covers_what_issue_13_asks():
    points = load_table(TABLE)
    assert len(points) >= 15
    assert all(p.source_quote and p.url.startswith("https://") for p in points)
    assert all(p.split == split_of(p.id) for p in points if p.added is None)  # the first table: the fixed rule
    assert all(p.split in ("fit", "holdout") for p in points if p.added is not None)  # added later: declared
    assert sum(p.split == "holdout" for p in points) >= 15
    assert {p.gpu for p in points} >= {"H100", "A100"}
    assert {p.weights for p in points} >= {"bf16", "fp8"} and "fp8_e4m3" in {p.kv_dtype for p in points}
    assert any(model_card(p.model).is_moe for p in points) and any(not model_card(p.model).is_moe for p in points)
    kinds = {(p.workload.kind, p.workload.concurrency) for p in points}
    assert ("concurrency", 1) in kinds and any(k == "offline" for k, _ in kinds)
    assert {p.split for p in points} == {"fit", "report", "holdout"}


def test_a_point_marked_against_the_split_rule_is_refused(tmp_path):
    data = json.loads(TABLE.read_text())
    p = data["points"][0]
    p["split"] = "report" if p["split"] == "fit" else "fit"
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"points": [p]}))
    with pytest.raises(SpecError, match="split rule"):
        load_table(bad)


def test_a_point_added_later_declares_fit_or_holdout_and_a_holdout_point_is_never_fitted(tmp_path):
    data = json.loads(TABLE.read_text())
    p = next(q for q in data["points"] if q.get("added") and q["split"] == "holdout")
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"points": [{**p, "split": "report"}]}))
    with pytest.raises(SpecError, match="must be declared 'fit' or 'holdout'"):
        load_table(bad)
    (held,) = load_table(_write(tmp_path / "h.json", {"points": [p]}))
    assert held.split == "holdout" and held.added
    with pytest.raises(SpecError, match="'fit' half"):
        fit([held], ("mbu",))
    # holdout rounds: a later round names itself; a round needs the date it was added
    rounds = {q.round for q in load_table(TABLE) if q.split == "holdout"}
    assert rounds >= {1, 2}
    first = {k: v for k, v in data["points"][0].items() if k != "added"}
    with pytest.raises(SpecError, match="names a round but no 'added' date"):
        load_table(_write(tmp_path / "r.json", {"points": [{**first, "round": 2}]}))


def _write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_lengths_hit_the_published_totals_within_the_clients_filter():
    p, o = sharegpt_lengths(1000, 217.4, 201.5, seed=3)
    assert p.mean() == pytest.approx(217.4, rel=0.01) and o.mean() == pytest.approx(201.5, rel=0.01)
    assert p.min() >= 4 and p.max() <= 1024 and (p + o).max() <= 2048 and o.min() >= 4


def _tiny_point(split_id: str, value: float) -> Point:
    w = Workload(kind="concurrency", dataset="random", num_prompts=6, concurrency=2, input_len=100, output_len=40)
    return Point(id=split_id, source="test", url="https://example.org", source_quote=("x",), engine="sglang",
                 engine_version="0", model="qwen3-8b", gpu="H100", tp=1, weights="bf16", kv_dtype="bf16",
                 workload=w, metric="median_tpot_ms", value=value, unit="ms", split=split_of(split_id))


def test_fit_recovers_a_known_factor_and_refuses_report_points():
    ids = [i for i in (f"t{n}" for n in range(40)) if split_of(i) == "fit"][:2]
    truth = Efficiency(mbu=0.5)
    from autoresearch_dagster.emulator.validation import predict
    points = [_tiny_point(i, 1.0) for i in ids]
    points = [Point(**{**p.__dict__, "value": predict(p, truth)}) for p in points]
    res = fit(points, ("mbu",), Efficiency(mbu=0.8), max_evals=30)
    assert res.params["mbu"] == pytest.approx(0.5, rel=0.03)
    assert res.after["worst_abs_error"] < 0.02 < res.before["worst_abs_error"]
    report_id = next(i for i in (f"t{n}" for n in range(40)) if split_of(i) == "report")
    with pytest.raises(SpecError, match="'fit' half"):
        fit([_tiny_point(report_id, 5.0)], ("mbu",))


def test_metrics_follow_the_bench_clients_definitions():
    w = Workload(kind="offline", dataset="random", num_prompts=4, input_len=100, output_len=11)
    rq = point_requests(w)
    res = simulate(core({}, model="qwen3-8b", gpu_name="H100"), rq, sample_interval_s=3600.0, start_s=0.0)
    m = metrics_of(res, {r.rid: r.prompt_tokens for r in rq})
    dur = max(r.end_s for r in res.requests)
    assert m["total_token_throughput"] == pytest.approx(4 * 111 / dur)
    assert m["output_throughput"] == pytest.approx(4 * 11 / dur)
    tpot = np.median([(r.e2e_s - r.ttft_s) / 10 for r in res.requests]) * 1e3
    assert m["median_tpot_ms"] == pytest.approx(tpot)


# ------------------------------------------------------------------ one frontend process, per-GPU scales, vLLM on GPUs

def test_one_frontend_process_admits_a_burst_one_request_after_another():
    quick, serial = Efficiency(request_in_s=0.0, frontend_req_s=0.0), Efficiency(request_in_s=0.0, frontend_req_s=0.01)
    burst = reqs(50, 32, 2, prefix="f")  # all at t=0
    a = simulate(_engine(quick), burst)
    b = simulate(_engine(serial), burst)
    ttft_a = sorted(r.ttft_s for r in a.requests)
    ttft_b = sorted(r.ttft_s for r in b.requests)
    assert ttft_b[-1] >= 50 * 0.01 > ttft_a[-1]  # the last of 50 is handled after 50 x 10 ms
    assert ttft_b[0] < ttft_a[0]  # the first is prefilled alone instead of in one batch with all 50
    spread = simulate(_engine(serial), reqs(5, 32, 2, prefix="s", every=0.1))  # arrivals 100 ms apart: no queue
    alone = simulate(_engine(quick), reqs(5, 32, 2, prefix="s", every=0.1))
    assert np.allclose([r.ttft_s for r in spread.requests], [r.ttft_s + 0.01 for r in alone.requests], atol=1e-6)


def test_a_gpus_scales_slow_its_compute_and_memory_bound_steps():
    import dataclasses
    m, h100 = model_card("qwen3-8b"), gpu("H100")
    slow_compute = dataclasses.replace(h100, mfu_scale=h100.mfu_scale / 2)
    slow_memory = dataclasses.replace(h100, mbu_scale=h100.mbu_scale / 2)
    eff = Efficiency()
    base = CostModel(m, h100, tp=1, fp8_weights=False, kv_bytes=2.0, eff=eff)
    prefill = dict(prefill_tokens=8192, prefill_seqs=8, prefill_attn_work=8 * 1024 * 512)
    decode = dict(decode_reqs=8, decode_ctx=8 * 1000)
    c = CostModel(m, slow_compute, tp=1, fp8_weights=False, kv_bytes=2.0, eff=eff)
    assert c.step(**prefill).gemm_s - c._floor == pytest.approx(2 * (base.step(**prefill).gemm_s - base._floor), rel=1e-6)
    assert c.step(**decode).gemm_s == pytest.approx(base.step(**decode).gemm_s)  # weight streaming untouched
    mm = CostModel(m, slow_memory, tp=1, fp8_weights=False, kv_bytes=2.0, eff=eff)
    assert mm.step(**decode).gemm_s - mm._floor == pytest.approx(2 * (base.step(**decode).gemm_s - base._floor), rel=1e-6)
    assert mm.step(**prefill).gemm_s == pytest.approx(base.step(**prefill).gemm_s)
    assert c.step(**prefill).attn_s == pytest.approx(base.step(**prefill).attn_s)  # attention keeps attn_mfu


def test_fit_moves_a_gpus_scale_and_refuses_unknown_ones():
    from autoresearch_dagster.emulator.validation import gpus_with, predict
    ids = [i for i in (f"g{n}" for n in range(60)) if split_of(i) == "fit"][:2]
    truth = gpus_with({"gpu.H100.mbu_scale": 0.7})
    points = [_tiny_point(i, 1.0) for i in ids]
    points = [Point(**{**p.__dict__, "value": predict(p, None, truth)}) for p in points]
    res = fit(points, ("gpu.H100.mbu_scale",), max_evals=30)
    assert res.params["gpu.H100.mbu_scale"] == pytest.approx(0.7, rel=0.03)
    assert res.gpus["H100"].mbu_scale == pytest.approx(0.7, rel=0.03) and gpu("H100").mbu_scale != pytest.approx(0.7)
    with pytest.raises(SpecError, match="cannot fit"):
        fit(points, ("gpu.NOPE.mfu_scale",))
    with pytest.raises(SpecError, match="cannot fit"):
        fit(points, ("gpu.H100.clock",))


def test_vllm_runs_on_gpus_take_vllms_per_device_defaults():
    from autoresearch_dagster.emulator.engine_view import vllm_gpu_defaults
    card = model_card("qwen3-32b")
    a100, h100, b200 = (vllm_gpu_defaults(card, gpu(n)) for n in ("A100", "H100", "B200"))
    assert (a100["max_running_requests"], a100["chunked_prefill_size"]) == (256, 2048)
    assert (h100["max_running_requests"], h100["chunked_prefill_size"]) == (1024, 8192)
    assert (b200["max_running_requests"], b200["chunked_prefill_size"]) == (1024, 16384)
    assert all(c["enable_mixed_chunk"] and c["disable_overlap_schedule"] for c in (a100, h100, b200))
    # KV: 0.9 of the device less the activation peak; a larger token budget profiles a larger peak
    assert h100["mem_fraction_static"] < a100["mem_fraction_static"] < 0.9
    assert vllm_gpu_defaults(card, gpu("H100"), gpu_memory_utilization=0.95)["mem_fraction_static"] == pytest.approx(
        h100["mem_fraction_static"] + 0.05, abs=1e-6)


def test_vllm_releases_after_the_async_default_overlap_scheduling_with_the_forward_pass():
    from autoresearch_dagster.emulator.engine_view import vllm_async_by_default, vllm_gpu_defaults
    assert not vllm_async_by_default("0.11.0") and not vllm_async_by_default("0.9.2")
    assert not vllm_async_by_default("0.13.0") and vllm_async_by_default("0.14.0")
    assert vllm_async_by_default("0.17.1") and vllm_async_by_default("0.24.0") and vllm_async_by_default("1.0.0rc1")
    card = model_card("qwen3-8b")
    assert not vllm_gpu_defaults(card, gpu("H100"), async_scheduling=True)["disable_overlap_schedule"]
    # the same closed-loop point replayed as vLLM 0.11 and as 0.17: the async release hides its CPU work
    base = dict(id="q8-async", source="test", url="https://example.invalid/x", source_quote=("x",), engine="vllm",
                model="qwen3-8b", gpu="H100", tp=1, weights="bf16", kv_dtype="bf16",
                workload=Workload(kind="concurrency", dataset="sharegpt", num_prompts=64, concurrency=32,
                                  total_input_tokens=64 * 200, total_output_tokens=64 * 200),
                metric="median_tpot_ms", value=1.0, unit="ms", split="fit", config={"enable_mixed_chunk": True})
    sync, asyn = (run_point(Point(**base, engine_version=v))["median_tpot_ms"] for v in ("0.11.0", "0.17.1"))
    assert asyn < sync


def test_calibration_transfer_learns_an_endpoints_speed_from_one_run_and_carries_it_to_other_settings():
    from autoresearch_dagster.emulator.validation import anchor_of, calibrate_on, same_traffic, transfer
    sg = Workload(kind="offline", dataset="sharegpt", num_prompts=60, total_input_tokens=60 * 300,
                  total_output_tokens=60 * 150)
    rnd = Workload(kind="offline", dataset="random", num_prompts=40, input_len=2000, output_len=100)
    assert same_traffic(sg, Workload(**{**sg.__dict__, "total_input_tokens": 60 * 306}))  # a re-run's totals
    assert not same_traffic(sg, Workload(**{**sg.__dict__, "total_input_tokens": 60 * 340}))
    assert not same_traffic(sg, rnd) and same_traffic(rnd, rnd)

    def pt(pid, workload, weights="bf16", config=None, engine="sglang", value=1.0):
        return Point(id=pid, source="test", url="https://example.invalid/t", source_quote=("x",), engine=engine,
                     engine_version="0.5.5", model="qwen3-8b", gpu="H100", tp=1, weights=weights, kv_dtype="bf16",
                     workload=workload, metric="total_token_throughput", value=value, unit="tok/s", split="holdout",
                     config=config or {}, added="2026-12-04")

    # an endpoint whose GPU streams and computes slower than the defaults say: its "published" figures are the
    # emulator's own under hidden factors, which the transfer does not see
    truth = Efficiency().replace(mbu=Efficiency().mbu * 0.7, gemm_mfu=Efficiency().gemm_mfu * 0.75)
    base = [pt("a-sg", sg), pt("a-sg-fp8", sg, "fp8", {"quantization": "fp8"}), pt("a-rand", rnd)]
    points = [dataclasses.replace(p, value=predict(p, truth)) for p in base]
    assert anchor_of(points).id == "a-sg"  # the bf16 ShareGPT baseline, not its fp8 twin
    eff = calibrate_on(points[0], ("mbu", "gemm_mfu"))
    assert abs(predict(points[0], eff) / points[0].value - 1) < 0.02  # the anchor is explained
    assert eff.mbu < Efficiency().mbu or eff.gemm_mfu < Efficiency().gemm_mfu  # by a slower GPU
    rows = {r.point.id: r for r in transfer(points)}
    assert set(rows) == {"a-sg-fp8", "a-rand"}  # the anchor itself is not scored
    fp8 = rows["a-sg-fp8"]
    assert abs(fp8.error) < abs(fp8.default_error) / 2 and abs(fp8.error) < 0.05  # same traffic, fp8: carried over
    assert fp8.priced_change > 0.02  # the emulator does price fp8 weights as a change


def test_engine_pairs_match_sglang_and_vllm_on_one_setup_and_flag_ratios_no_shared_factor_can_fix():
    from autoresearch_dagster.emulator.validation import Row, engine_pairs
    sg = Workload(kind="offline", dataset="sharegpt", num_prompts=100, total_input_tokens=30000,
                  total_output_tokens=20000)

    def row(pid, engine, value, predicted, *, workload=sg, gpu="H100", config=None):
        p = Point(id=pid, source="test", url="https://example.invalid/page", source_quote=("x",), engine=engine,
                  engine_version="1", model="qwen3-8b", gpu=gpu, tp=1, weights="bf16", kv_dtype="bf16",
                  workload=workload, metric="total_token_throughput", value=value, unit="tok/s", split="holdout",
                  config=config or {}, added="2026-12-05")
        return Row(p, predicted)

    rerun = Workload(**{**sg.__dict__, "total_input_tokens": 30300})  # the same sample, a few prompts truncated
    rows = [row("s", "sglang", 1200.0, 1000.0), row("v", "vllm", 1000.0, 1000.0, workload=rerun),
            row("v-flag", "vllm", 990.0, 1000.0, config={"max_num_seqs": 512}),  # the flagless vLLM run is the pair
            row("s-a100", "sglang", 100.0, 1000.0, gpu="A100"), row("v-a100", "vllm", 1000.0, 900.0, gpu="A100"),
            row("s-lone", "sglang", 500.0, 500.0, gpu="L40S"),  # no vLLM run on that GPU: no pair
            row("s-rand", "sglang", 900.0, 900.0, workload=Workload(kind="offline", dataset="random", num_prompts=100,
                                                                     input_len=128, output_len=4))]
    pairs = {e.sglang.point.id: e for e in engine_pairs(rows)}
    assert set(pairs) == {"s", "s-a100"}
    assert pairs["s"].vllm.point.id == "v"
    assert pairs["s"].published_ratio == pytest.approx(1.2) and pairs["s"].ratio_error == pytest.approx(1 / 1.2 - 1)
    assert not pairs["s"].out_of_band  # e.g. -9% / +9% on the two runs would do
    a100 = pairs["s-a100"]
    assert a100.ratio_error == pytest.approx(1000 / 900 / 0.1 - 1) and a100.out_of_band
    # out of band means what it says: whatever common factor scales both predictions, one run stays beyond 25%
    best = min(max(abs(k * a100.sglang.predicted / 100 - 1), abs(k * a100.vllm.predicted / 1000 - 1))
               for k in np.geomspace(0.01, 10, 4001))
    assert best > 0.25


def test_random_runs_replay_the_lengths_their_client_printed():
    from autoresearch_dagster.emulator.validation import point_requests

    fixed = Workload(kind="offline", dataset="random", num_prompts=500, input_len=2000, output_len=100,
                     total_output_tokens=49_000)  # within 5% of 500 x 100: a few early EOS, replayed as asked
    assert {r.output_tokens for r in point_requests(fixed)} == {100}
    # sglang.bench_serving's default range ratio 0: lengths uniform in [1, L], so the printed totals are about half
    uniform = Workload(kind="offline", dataset="random", num_prompts=2000, input_len=1024, output_len=512,
                       total_input_tokens=2000 * 512, total_output_tokens=2000 * 256)
    reqs = point_requests(uniform)
    prompts = np.array([r.prompt_tokens for r in reqs])
    outs = np.array([r.output_tokens for r in reqs])
    assert prompts.mean() == pytest.approx(512, rel=0.03) and prompts.max() <= 1024 and prompts.min() >= 1
    assert outs.mean() == pytest.approx(256, rel=0.03) and outs.max() <= 512 and len(set(outs)) > 100
    stopped = Workload(kind="offline", dataset="random", num_prompts=500, input_len=4000, output_len=200,
                       total_output_tokens=52_309)  # EOS without --ignore-eos: about half the asked tokens
    assert np.mean([r.output_tokens for r in point_requests(stopped)]) == pytest.approx(104.6, rel=0.05)
