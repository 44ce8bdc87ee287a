"""The published knob-effect table: it parses, every pair names its source, and its fit / report split is stable."""
import json
from pathlib import Path

import pytest

from autoresearch_dagster.emulator.knob_effects import (EffectRow, half_scores, load_pairs, pair_split, split_of)
from autoresearch_dagster.spec import SpecError

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "knob_effects.json"
REQUIRED = ("id", "url", "source", "engine", "engine_version", "model", "gpu", "tp", "change", "split", "workload",
            "baseline", "candidate", "source_quote")


def test_every_pair_parses_names_its_source_and_carries_its_hash_split():
    raw = json.loads(TABLE.read_text())
    pairs = load_pairs(TABLE)
    assert len(pairs) == len(raw["pairs"]) > 0
    for d in raw["pairs"]:
        missing = [k for k in REQUIRED if k not in d]
        assert not missing, (d.get("id"), missing)
        assert d["url"].startswith("https://") and d["source_quote"] and all(q.strip() for q in d["source_quote"])
        assert d["engine"] in ("sglang", "vllm")
        assert d["baseline"]["values"] and d["candidate"]["values"]
        assert d["split"] == split_of(d["url"], d["id"])
    halves = {h: {p.id for p in pairs if pair_split(p) == h} for h in ("fit", "report")}
    assert halves["fit"] and halves["report"] and not halves["fit"] & halves["report"]
    assert halves["fit"] | halves["report"] == {p.id for p in pairs}
    for d in raw.get("excluded", []):
        assert (d.get("id") or d.get("url")) and d.get("why")


def test_the_split_is_a_pure_function_of_url_and_id_and_a_wrong_stored_split_is_refused(tmp_path):
    assert split_of("https://a.example/x", "p1") == split_of("https://a.example/x", "p1")
    ids = [f"p{i}" for i in range(200)]
    share = sum(split_of("https://a.example/x", i) == "fit" for i in ids) / len(ids)
    assert 0.35 < share < 0.65  # roughly halves
    raw = json.loads(TABLE.read_text())
    d = raw["pairs"][0]
    d["split"] = "report" if d["split"] == "fit" else "fit"
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"pairs": [d]}))
    with pytest.raises(SpecError, match="split"):
        load_pairs(bad)


def test_half_scores_count_direction_error_and_coverage_on_moved_pairs_only():
    pair = load_pairs(TABLE)[0]
    rows = [EffectRow(pair, "output_throughput", 1.30, 1.0, 1.25),  # right way, 4% off
            EffectRow(pair, "output_throughput", 0.70, 1.0, 1.10),  # wrong way
            EffectRow(pair, "output_throughput", 1.01, 1.0, 1.50)]  # within noise: not scored
    s = half_scores(rows, [])
    assert s["n"] == 2 and s["n_all"] == 3
    assert s["direction"] == pytest.approx(0.5)
    assert s["worst_log_error"] == pytest.approx(abs(__import__("math").log(1.10 / 0.70)))
    assert s["coverage_prior"] == pytest.approx(0.5)  # 1.25 vs 1.30 inside +-17%; 1.10 vs 0.70 outside
