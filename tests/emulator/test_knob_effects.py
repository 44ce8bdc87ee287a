"""Knob-effect validation: published one-flag-changed pairs against the emulator's predicted ratios."""
import json

import pytest

from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.emulator.knob_effects import EffectRow, evaluate_pairs, load_pairs, summarize
from autoresearch_dagster.emulator.validation import run_point
from autoresearch_dagster.spec import SpecError


def _pair(pid="p", *, base_cfg=None, cand_cfg=None, values=None, workload=None):
    return {"id": pid, "url": "https://example.invalid/thread", "source": "test", "source_quote": ["x"],
            "engine": "sglang", "engine_version": "0.5.5", "model": "qwen3-8b", "gpu": "H100", "tp": 1,
            "weights": "bf16", "kv_dtype": "bf16", "change": "kv_cache_dtype: auto -> fp8_e4m3",
            "workload": workload or {"kind": "concurrency", "dataset": "random", "num_prompts": 64, "concurrency": 32,
                                     "input_len": 1500, "output_len": 200},
            "baseline": {"config": base_cfg or {}, "values": (values or {}).get("baseline", {"output_throughput": 1})},
            "candidate": {"config": {"kv_cache_dtype": "fp8_e4m3"} if cand_cfg is None else cand_cfg,
                          "values": (values or {}).get("candidate", {"output_throughput": 1})}}


def test_a_pair_scores_the_published_ratio_against_the_emulators_with_and_without_calibration(tmp_path):
    # "published" figures: the emulator's own under an endpoint whose HBM streams slower than the defaults say
    truth = Efficiency().replace(mbu=Efficiency().mbu * 0.7)
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"pairs": [_pair()]}))
    pair = load_pairs(table)[0]
    b, c = run_point(pair.baseline, truth), run_point(pair.candidate, truth)
    values = {"baseline": {m: b[m] for m in ("output_throughput", "median_tpot_ms", "median_ttft_ms")},
              "candidate": {m: c[m] for m in ("output_throughput", "median_tpot_ms", "median_ttft_ms")}}
    table.write_text(json.dumps({"pairs": [_pair(values=values)]}))
    pair = load_pairs(table)[0]
    assert pair.metrics == ["output_throughput", "median_tpot_ms", "median_ttft_ms"]  # primary first
    report = evaluate_pairs([pair])
    assert not report.failed and {r.metric for r in report.rows} == set(pair.metrics)
    tp = next(r for r in report.rows if r.metric == "output_throughput")
    assert tp.published == pytest.approx(c["output_throughput"] / b["output_throughput"])
    assert tp.published > 1.05 and tp.agrees(tp.default)  # fp8 KV speeds a KV-read-bound decode up
    assert abs(tp.error) < 0.05  # calibrated on the baseline, the ratio is the truth's
    s = summarize(report.rows)
    assert s["n"] == 3 and s["calibrated_median"] < 0.05 and s["calibrated_direction"] == 1.0


def test_throughput_at_a_finite_rate_is_not_scored_and_bad_pairs_are_refused(tmp_path):
    rate = {"kind": "rate", "dataset": "random", "num_prompts": 40, "rate_rps": 2.0, "input_len": 500, "output_len": 50}
    values = {"baseline": {"output_throughput": 100.0, "median_tpot_ms": 8.0},
              "candidate": {"output_throughput": 100.0, "median_tpot_ms": 7.0}}
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"pairs": [_pair(workload=rate, values=values)]}))
    assert load_pairs(table)[0].metrics == ["median_tpot_ms"]  # the offered rate, not the server, sets throughput
    for bad, match in ((_pair(cand_cfg={"kv_cache_dtype": "fp9"}), "not allowed"),
                       (_pair(cand_cfg={"no_such_knob": 1}), "unknown server knob 'no_such_knob'"),
                       (_pair(cand_cfg={}), "configs are the same"),
                       (_pair(values={"baseline": {"output_throughput": 1}, "candidate": {"median_tpot_ms": 1}}),
                        "no metric printed for both runs")):
        table.write_text(json.dumps({"pairs": [bad]}))
        with pytest.raises(SpecError, match=match):
            load_pairs(table)
    table.write_text(json.dumps({"pairs": [_pair(), _pair()]}))
    with pytest.raises(SpecError, match="appears twice"):
        load_pairs(table)


def test_direction_agreement_treats_small_published_changes_as_none():
    row = lambda pub: EffectRow(None, "output_throughput", pub, 1.0, 1.0)  # noqa: E731
    assert row(1.03).agrees(0.98) and not row(1.2).agrees(1.01) and row(0.8).agrees(0.9) and not row(0.8).agrees(1.1)
