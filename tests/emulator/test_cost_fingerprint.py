"""The cost model's fingerprint and the search benchmark's true-capacity cache keyed on it: numbers cached under
another cost model (version or default factors) are never read, and a rewrite drops them."""
import json
import sys
from pathlib import Path

from autoresearch_dagster.emulator import cost

ROOT = Path(__file__).resolve().parents[2]


def _bench_search():
    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_search
    return bench_search


def test_fingerprint_follows_version_and_default_factors(monkeypatch):
    now = cost.cost_model_fingerprint()
    assert now == cost.cost_model_fingerprint()  # deterministic
    monkeypatch.setattr(cost, "COST_MODEL_VERSION", cost.COST_MODEL_VERSION + 1)
    bumped = cost.cost_model_fingerprint()
    monkeypatch.undo()
    refitted = cost.Efficiency().replace(request_in_s=cost.Efficiency().request_in_s * 2)
    monkeypatch.setattr(cost, "Efficiency", lambda: refitted)
    refit = cost.cost_model_fingerprint()
    assert len({now, bumped, refit}) == 3


def test_truth_cache_ignores_and_prunes_entries_of_another_cost_model(tmp_path, monkeypatch):
    bs = _bench_search()
    proto = bs.truth_protocol()
    path = tmp_path / "truth.json"
    path.write_text(json.dumps({f"{proto}:demo:aaa": 20.5, f"{proto}:demo:bbb": None, "0ld0ld00:demo:aaa": 25.0}))
    cache, stale = bs.load_truth_cache(path, proto)
    assert cache == {f"{proto}:demo:aaa": 20.5, f"{proto}:demo:bbb": None} and stale == 1
    # a change of the cost model's defaults changes the protocol: every entry above is stale under it
    monkeypatch.setattr(bs, "cost_model_fingerprint", lambda: "refitted0000")
    other = bs.truth_protocol()
    assert other != proto and bs.load_truth_cache(path, other) == ({}, 3)
    assert bs.load_truth_cache(tmp_path / "missing.json", proto) == ({}, 0)



def test_hidden_factors_stay_within_the_spread_and_cap_only_fractions_of_a_peak():
    """An emulated endpoint's own factors are its defaults times U(0.7, 1.3); achieved fractions stay below their
    peak, while times and the MoE width (``moe_n_half``, hundreds of columns) are never capped."""
    from dataclasses import asdict

    from autoresearch_dagster.emulator.cost import NOT_FRACTIONS, Efficiency, hidden_efficiency

    default = asdict(Efficiency())
    assert "moe_n_half" in NOT_FRACTIONS and "request_in_s" in NOT_FRACTIONS and "gemm_mfu" not in NOT_FRACTIONS
    for seed in range(20):
        for k, v in asdict(hidden_efficiency(seed)).items():
            if k in NOT_FRACTIONS:
                assert 0.7 * default[k] <= v <= 1.3 * default[k], (seed, k, v)
            else:
                assert min(0.7 * default[k], 0.95) <= v <= 0.95, (seed, k, v)
