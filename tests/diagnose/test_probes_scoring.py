"""Probe recipes and transforms, and evidence-based hypothesis scoring."""
from __future__ import annotations

import json

import pytest

from autoresearch_dagster.diagnose.hypotheses import BOTTLENECKS, SIGNALS, probe_signals, score
from autoresearch_dagster.diagnose.probes import (load_recipes, record_probe_use, reduce_signal, transform,
                                                  useful_probes)
from autoresearch_dagster.pool.workload import prefix_reuse
from autoresearch_dagster.pool.schema import PoolRequest
from autoresearch_dagster.spec import KNOBS, SpecError
from autoresearch_dagster.tokens import block_hashes, count_tokens, render_prompt, synth_text


def _req(i, text, out=100):
    msgs = [{"role": "system", "content": "You are a support agent." * 20}, {"role": "user", "content": text}]
    rendered = render_prompt(msgs)
    return PoolRequest(id=f"r{i}", arrival_s=float(i), conversation_id=None, turn=None, api="chat", messages=msgs,
                       prompt=None, tools=None, tool_choice=None, response_format=None, sampling={"temperature": 0},
                       prompt_tokens=count_tokens(rendered), output_tokens=out,
                       block_hashes=block_hashes(rendered, 16), block_tokens=16, split="serving")


POOL = [_req(i, synth_text(50 + 10 * i, i)) for i in range(12)]


def test_catalog_knobs_and_directions_are_the_specs():
    for b in BOTTLENECKS.values():
        assert all(k in KNOBS for k in b.knobs), b.name
        assert b.direction in ("scheduling_cache", "speculative", "kernels_quant", "parallel_admission")
        assert b.name in SIGNALS


def test_package_recipes_load_and_cover_the_six_suspects():
    names = {r.name for r in load_recipes()}
    assert {"prefill_cost", "decode_cost", "prefix_cache", "interference", "concurrency", "burst"} <= names
    for r in load_recipes():
        assert len(r.variants) >= 2 and r.signals


def test_user_recipe_added_without_code(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text(
        "name: tiny_outputs\nsuspect: per-request overhead\nvariants:\n"
        "  - {name: a, transforms: [{op: set_output, tokens: 1}]}\n"
        "  - {name: b, transforms: [{op: set_output, tokens: 8}]}\n"
        "signals:\n  - {key: r, y: e2e_ms.p50, kind: ratio, supports: [{bottleneck: admission_limit, low: 1, high: 2}]}\n")
    monkeypatch.setenv("AUTORESEARCH_PROBES_DIR", str(tmp_path))
    recipes = {r.name: r for r in load_recipes()}
    assert "tiny_outputs" in recipes
    extra, feats = probe_signals([recipes["tiny_outputs"]], {"tiny_outputs": {"r": 1.5}})
    assert feats == {"probe.tiny_outputs.r": 1.5} and extra["admission_limit"][0].strength(1.5) == 0.5
    (tmp_path / "bad.yaml").write_text("name: x\nsuspect: y\nvariants: [{name: a}, {name: b, transforms: [{op: nope}]}]\n"
                                       "signals: [{key: k, y: ttft_ms.p50, kind: ratio}]\n")
    with pytest.raises(SpecError, match="bad.yaml.*nope"):
        load_recipes()


def test_transforms_change_one_variable_and_keep_hashes_consistent():
    longer = transform(POOL, [{"op": "append_prompt", "factor": 3.0}])
    for a, b in zip(POOL, longer):
        assert b.prompt_tokens == pytest.approx(3 * a.prompt_tokens, abs=2)
        assert b.output_tokens == a.output_tokens
        assert b.block_hashes[: len(a.block_hashes) - 1] == a.block_hashes[: len(a.block_hashes) - 1]
        assert b.block_hashes == block_hashes(render_prompt(b.messages), 16)
    assert POOL[0].prompt_tokens < longer[0].prompt_tokens  # originals untouched
    fixed = transform(POOL, [{"op": "set_prompt", "tokens": 500}, {"op": "set_output", "tokens": 7}])
    assert all(abs(r.prompt_tokens - 500) <= 5 and r.output_tokens == 7 for r in fixed)
    assert prefix_reuse(fixed)[0] == 0.0
    # the pool shares its system prompt; unique_prefix removes that, shared_prefix imposes a long one
    assert prefix_reuse(POOL)[0] > 0.3
    assert prefix_reuse(transform(POOL, [{"op": "unique_prefix"}]))[0] == 0.0
    shared = transform(POOL, [{"op": "unique_prefix"}, {"op": "shared_prefix", "fraction": 0.75}])
    assert prefix_reuse(shared)[0] > 0.5
    inj = transform(POOL, [{"op": "inject_long", "every": 4, "tokens": 4000, "output": 3}])
    assert [r.prompt_tokens > 3900 for r in inj].count(True) == 3 and inj[3].output_tokens == 3


def test_reduce_signal_kinds():
    assert reduce_signal("elasticity", [100, 400], [10, 40]) == pytest.approx(1.0)
    assert reduce_signal("elasticity", [100, 400], [10, 10]) == pytest.approx(0.0)
    assert reduce_signal("ratio", [None, None], [10, 25]) == 2.5
    assert reduce_signal("diff", [None, None], [0.1, 0.7]) == pytest.approx(0.6)
    assert reduce_signal("last", [None, None], [None, 0.9]) == 0.9
    assert reduce_signal("ratio", [None, None], [None, 3.0]) is None


def _features(**kw):
    base = {"w.share_long_prompts": 0.0, "w.prefix_hit_rate": 0.05, "w.interarrival_cv": 1.0,
            "w.dispersion_index": 1.0, "w.prompt_output_ratio": 3.0, "c.breaks_tpot_itl": 0.0, "c.breaks_ttft": 1.0,
            "c.itl_tail_ratio": 1.5, "c.per_token_regime": 0.0, "c.tpot_headroom_low": 0.2, "c.ttft_headroom_low": 0.05,
            "m.token_usage_max": 0.5, "m.retractions": 0.0, "m.queue_nonempty": 0.5, "m.share_at_running_cap": 0.0,
            "m.share_above_graph_bs": 0.0, "m.cache_hit_rate": 0.04, "m.spec_accept_length": None,
            "m.running_mean": 60.0, "cfg.speculative": 0.0, "cfg.fp8": 0.0}
    base.update(kw)
    return base


@pytest.mark.parametrize("changes,expected", [
    ({"m.token_usage_max": 0.99, "m.retractions": 40.0, "m.usage_when_queued": 0.95}, "kv_capacity"),
    ({"m.at_cap_when_queued": 0.95, "m.share_at_running_cap": 0.6, "m.token_usage_max": 0.4}, "admission_limit"),
    ({"m.share_above_graph_bs": 0.9, "c.per_token_regime": 1.0, "c.breaks_ttft": 0.0, "c.breaks_tpot_itl": 1.0},
     "cuda_graph_coverage"),
    ({"w.prefix_hit_rate": 0.7, "m.cache_hit_rate": 0.0}, "missed_prefix_reuse"),
    ({"w.interarrival_cv": 3.0, "w.dispersion_index": 12.0}, "burst_queueing"),
    ({"c.tpot_headroom_low": 0.9, "c.breaks_tpot_itl": 1.0, "c.breaks_ttft": 0.0, "m.running_mean": 6.0},
     "decode_bound_small_batch"),
    ({"c.itl_tail_ratio": 8.0, "c.breaks_tpot_itl": 1.0, "c.breaks_ttft": 0.0, "w.share_long_prompts": 0.3},
     "prefill_interference"),
    ({"c.ttft_headroom_low": 0.6, "w.prompt_output_ratio": 40.0}, "compute_bound_prefill"),
])
def test_scoring_ranks_the_bottleneck_the_evidence_points_at(changes, expected):
    hyps = score(_features(**changes))
    assert hyps[0].bottleneck == expected, [(h.bottleneck, h.score) for h in hyps[:3]]
    assert hyps[0].evidence and hyps[0].knobs == list(BOTTLENECKS[expected].knobs)
    assert hyps[0].score > hyps[1].score


def test_scoring_without_evidence_is_flat_and_missing_sources_lower_confidence():
    hyps = score({})
    assert all(h.score == 0 and h.coverage == 0 for h in hyps)
    full = score(_features(**{"m.token_usage_max": 0.99, "m.retractions": 40.0}))
    partial = score({"m.token_usage_max": 0.99})
    kv_full = next(h for h in full if h.bottleneck == "kv_capacity")
    kv_part = next(h for h in partial if h.bottleneck == "kv_capacity")
    assert kv_part.coverage < kv_full.coverage and kv_part.score < kv_full.score


def test_probe_memory_roundtrip(tmp_path):
    from autoresearch_dagster.diagnose.probes import ProbeResult

    mem = tmp_path / "memory" / "probes.jsonl"
    traits = {"long_prompts": True, "prefix_heavy": False, "bursty": False, "short_outputs": False}
    res = [ProbeResult("interference", "x", {"itl_p99_ratio": 5.0}, [], "i", ["prefill_interference"]),
           ProbeResult("burst", "y", {"ttft_p99_ratio": 1.1}, [], "b", [])]
    record_probe_use(mem, "ep", traits, res, ["prefill_interference", "kv_capacity"])
    record_probe_use(mem, "ep2", traits, res[:1], ["kv_capacity"])
    rows = [json.loads(x) for x in mem.read_text().splitlines()]
    assert len(rows) == 3 and rows[0]["useful_for"] == ["prefill_interference"] and rows[2]["useful_for"] == []
    assert useful_probes(mem, traits) == ["interference"]
    assert useful_probes(mem, {**traits, "long_prompts": False}) == []
