import numpy as np
import pytest

from autoresearch_dagster.pool.fidelity import FidelityThresholds, compare, summarize
from autoresearch_dagster.pool.schema import PoolRequest
from autoresearch_dagster.pool.workload import PrefixCache, WorkloadStats, prefix_reuse, workload_stats


def _stats(arr, prompt, out, hashes, lat=None):
    ws = WorkloadStats(block_tokens=64)
    for i in range(len(arr)):
        ws.add(float(arr[i]), int(prompt[i]), int(out[i]), hashes[i], None if lat is None else float(lat[i]))
    return ws


def _workload(seed=0, n=3000):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.gamma(0.5, 0.4, n))
    prompt = rng.lognormal(7, 0.8, n).astype(int) + 1
    out = rng.integers(5, 800, n)
    hashes = [[int(rng.integers(0, 5))] + [int(x) for x in rng.integers(10, 10**9, 3)] for _ in range(n)]
    lat = rng.uniform(0.5, 5, n)
    return arr, prompt, out, hashes, lat


def test_faithful_pool_passes():
    w = _workload()
    rep = compare(_stats(*w), _stats(*w))
    assert rep["passed"] and not rep["failures"]
    assert {"prompt_tokens.ks", "prefix_hit_rate.delta_pp", "arrival.idc_1s_ratio", "arrival.idc_60s_ratio",
            "concurrency.p95_ratio"} <= set(rep["checks"])
    assert all({"value", "threshold", "passed"} <= set(c) for c in rep["checks"].values())


def test_distorted_prompt_lengths_fail_naming_the_statistic():
    arr, prompt, out, hashes, lat = _workload()
    rep = compare(_stats(arr, prompt, out, hashes, lat), _stats(arr, (prompt * 1.3).astype(int), out, hashes, lat))
    assert not rep["passed"]
    assert not rep["checks"]["prompt_tokens.ks"]["passed"] and rep["checks"]["output_tokens.ks"]["passed"]
    assert any("prompt_tokens.p50_ratio" in f and "off by" in f for f in rep["failures"])


def test_distorted_arrivals_and_prefix_reuse_fail():
    arr, prompt, out, hashes, lat = _workload()
    poisson = np.cumsum(np.random.default_rng(1).exponential(arr[-1] / len(arr), len(arr)))
    rep = compare(_stats(arr, prompt, out, hashes, lat), _stats(poisson, prompt, out, hashes, lat))
    failed = {k for k, c in rep["checks"].items() if not c["passed"]}
    assert "arrival.cv_ratio" in failed and "arrival.idc_10s_ratio" in failed
    assert "prompt_tokens.ks" not in failed
    unique = [[10**12 + 7 * i + j for j in range(4)] for i in range(len(arr))]
    rep2 = compare(_stats(arr, prompt, out, hashes, lat), _stats(arr, prompt, out, unique, lat))
    assert not rep2["checks"]["prefix_hit_rate.delta_pp"]["passed"]
    assert "pp" in rep2["checks"]["prefix_hit_rate.delta_pp"]["message"]


def test_thresholds_are_configurable():
    arr, prompt, out, hashes, lat = _workload()
    pool = _stats(arr, (prompt * 1.03).astype(int), out, hashes, lat)
    assert not compare(_stats(arr, prompt, out, hashes, lat), pool)["passed"]  # mean off by 3% > 2%
    loose = FidelityThresholds(ks_max=0.2, p50_tol=0.05, p99_tol=0.1, mean_tol=0.05)
    assert compare(_stats(arr, prompt, out, hashes, lat), pool, loose)["passed"]


def test_bounded_memory_statistics_track_the_exact_ones():
    arr, prompt, out, hashes, lat = _workload(n=20000)
    exact, small = WorkloadStats(block_tokens=64), WorkloadStats(block_tokens=64, max_samples=2000)
    small.cache = PrefixCache(max_tracked=3000)
    for ws in (exact, small):
        for i in range(len(arr)):
            ws.add(float(arr[i]), int(prompt[i]), int(out[i]), hashes[i], float(lat[i]))
    se, ss = summarize(exact), summarize(small)
    assert len(small.prompt_sample) <= 2000 and ss["sampled_fraction"] < 0.2 and se["sampled_fraction"] == 1.0
    assert ss["prompt_tokens"]["mean"] == se["prompt_tokens"]["mean"]  # sums stay exact
    assert abs(ss["prompt_tokens"]["p50"] / se["prompt_tokens"]["p50"] - 1) < 0.1
    assert len(small.cache._seen) <= 3000 and small.cache.level > 0
    assert abs(ss["prefix_hit_rate"] - se["prefix_hit_rate"]) < 0.02
    assert ss["arrival"] == se["arrival"] and ss["concurrency"] == se["concurrency"]
    # two sides fed the same requests sample the same ones, so a faithful copy still compares exactly
    other = WorkloadStats(block_tokens=64, max_samples=2000)
    other.add_many(arr, prompt, out)
    assert list(other.prompt_sample) == list(small.prompt_sample)


def test_streaming_concurrency_matches_a_direct_sweep():
    rng = np.random.default_rng(5)
    arr = np.cumsum(rng.exponential(0.2, 500))
    lat = rng.uniform(0.1, 3.0, 500)
    ws = _stats(arr, np.ones(500), np.ones(500), [[]] * 500, lat)
    times = np.concatenate([arr, arr + lat])
    delta = np.concatenate([np.ones(500), -np.ones(500)])
    order = np.lexsort((delta, times))
    level, dur = np.cumsum(delta[order])[:-1], np.diff(times[order])
    c = summarize(ws)["concurrency"]
    assert c["mean"] == pytest.approx((level * dur).sum() / dur.sum())
    o = np.argsort(level, kind="stable")
    assert c["p95"] == level[o][np.searchsorted(np.cumsum(dur[o]) / dur.sum(), 0.95)]


def _pool_request(i, arrival, prompt, hashes):
    return PoolRequest(id=str(i), arrival_s=arrival, conversation_id=None, turn=None, api="chat",
                       messages=[{"role": "user", "content": "x"}], prompt=None, tools=None, tool_choice=None,
                       response_format=None, sampling={}, prompt_tokens=prompt, output_tokens=10,
                       block_hashes=hashes, block_tokens=64, split="serving")


def test_prefix_hit_rate_is_the_token_share_an_infinite_cache_serves():
    # Two requests of 100 prompt tokens: one full 64-token block (hash 7, shared) and a 36-token tail.
    # The old fidelity definition, cached blocks / all blocks = 1 - distinct/total = 1 - 1/2 = 0.50;
    # the old diagnosis definition (kept), cached tokens / all prompt tokens = 64 / 200 = 0.32.
    # A third request of 64 tokens shares no block: blocks 1 - 2/3 = 0.33 vs tokens 64 / 264.
    reqs = [_pool_request(0, 0.0, 100, [7]), _pool_request(1, 1.0, 100, [7])]
    assert workload_stats(reqs).prefix_hit_rate == pytest.approx(0.32)
    assert prefix_reuse(reqs)[0] == pytest.approx(0.32)
    fid = WorkloadStats(block_tokens=64)
    for r in reqs:
        fid.add(r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes)
    assert summarize(fid)["prefix_hit_rate"] == pytest.approx(0.32)
    more = reqs + [_pool_request(2, 2.0, 64, [8])]
    assert workload_stats(more).prefix_hit_rate == pytest.approx(64 / 264)


def test_workload_summary_keeps_every_statistic_diagnosis_reports():
    reqs = [_pool_request(i, float(i), 100, [7]) for i in range(5)]
    d = workload_stats(reqs).to_dict()
    assert d["n_requests"] == 5 and d["prefix_hit_rate"] == pytest.approx(4 * 64 / 500)
    assert d["top_prefixes"] == [{"prefix_tokens": 64, "requests": 4, "tokens_saved": 256}]
    assert d["prompt_tokens"]["max"] == 100 and d["mean_rate_rps"] == pytest.approx(1.0)
