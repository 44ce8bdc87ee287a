"""Replay-vs-production fidelity: a faithful replay passes, and each property drifting alone is named."""
import numpy as np
import pytest

from autoresearch_dagster.loadgen.records import RequestRecord
from autoresearch_dagster.pool.production import ProductionLog, Timeline, read_production, replay_timeline
from autoresearch_dagster.pool.production_fidelity import (ReplayThresholds, compare, concurrency, format_report)


def production(seed=0, n=1500) -> Timeline:
    """Bursty arrivals over ~12 minutes, lognormal prompts with a cached share, latencies of a few seconds."""
    rng = np.random.default_rng(seed)
    start = np.cumsum(rng.gamma(0.5, 1.0, n))
    prompt = rng.lognormal(7, 0.7, n).astype(np.int64) + 20
    cached = (prompt * rng.uniform(0.3, 0.9, n)).astype(np.int64)
    output = rng.integers(10, 900, n)
    end = start + 0.2 + output * 0.012 * rng.lognormal(0, 0.1, n)
    return Timeline(start, end, prompt, output, cached)


def replay_of(p: Timeline, seed=1, **changes) -> Timeline:
    """What a faithful replay does: production's times and lengths, its own latency jitter; then ``changes``."""
    rng = np.random.default_rng(seed)
    latency = (p.end_s - p.start_s) * rng.lognormal(0, 0.05, len(p))
    cols = {"start_s": p.start_s - p.start_s[0] + 5.0, "prompt_tokens": p.prompt_tokens.copy(),
            "output_tokens": p.output_tokens.copy(),
            "cached_tokens": np.minimum(p.prompt_tokens, (p.cached_tokens // 64) * 64 + 32)}
    cols.update(changes)
    cols["end_s"] = changes.get("end_s", cols["start_s"] + latency)
    return Timeline(**cols)


def failed(report) -> set[str]:
    return {c["name"] for c in report["checks"] if not c["passed"]}


def test_a_faithful_replay_passes_every_property():
    p = production()
    rep = compare(p, replay_of(p))
    assert rep["passed"], rep["failures"]
    names = {c["name"] for c in rep["checks"]}
    assert {"cached_token_ratio", "concurrency.mean", "concurrency.p95", "concurrency.timeline", "arrival.rate",
            "arrival.interarrival_ks", "arrival.cv", "arrival.idc_1s", "arrival.idc_10s", "arrival.idc_60s",
            "prompt_tokens.ks", "prompt_tokens.mean", "output_tokens.ks", "output_tokens.mean"} == names
    for c in rep["checks"]:
        assert {"name", "production", "replay", "drift", "limit", "passed"} <= set(c), c
        assert not c.get("skipped"), c


def test_lost_prefix_reuse_fails_the_cached_token_ratio_alone():
    p = production()
    rep = compare(p, replay_of(p, cached_tokens=p.cached_tokens // 3))
    assert failed(rep) == {"cached_token_ratio"}
    (msg,) = rep["failures"]
    assert "cached_token_ratio drifted" in msg and "pp" in msg and "limit ±5 pp" in msg


def test_slower_service_fails_concurrency_alone():
    p = production()
    r = replay_of(p)
    slow = Timeline(r.start_s, r.start_s + 1.3 * (r.end_s - r.start_s), r.prompt_tokens, r.output_tokens,
                    r.cached_tokens)
    rep = compare(p, slow)
    assert {"concurrency.mean", "concurrency.timeline"} <= failed(rep) <= {"concurrency.mean", "concurrency.p95",
                                                                          "concurrency.timeline"}
    mean = next(c for c in rep["checks"] if c["name"] == "concurrency.mean")
    assert mean["drift"] == pytest.approx(0.3, abs=0.05) and "(+29.3%; limit ±15%)" in mean["message"]


def test_load_moved_in_time_fails_the_concurrency_timeline():
    """A busy first half then a quiet one, replayed quiet then busy: the same gaps and lengths."""
    rng = np.random.default_rng(3)
    gaps = np.concatenate([rng.exponential(0.25, 750), rng.exponential(1.0, 750)])
    p = production()

    def side(g):
        start = np.concatenate([[0.0], np.cumsum(g[:-1])])
        return Timeline(start, start + (p.end_s - p.start_s), p.prompt_tokens, p.output_tokens, p.cached_tokens)
    rep = compare(side(gaps), side(gaps[::-1]))
    got = failed(rep)
    assert "concurrency.timeline" in got and not {"arrival.rate", "arrival.cv", "arrival.interarrival_ks"} & got
    timeline = next(c for c in rep["checks"] if c["name"] == "concurrency.timeline")
    assert "the largest gap is the window at" in timeline["message"]


def test_compressed_arrivals_fail_the_arrival_checks():
    p = production()
    r = replay_of(p)
    fast = Timeline(r.start_s * 0.5, r.start_s * 0.5 + (r.end_s - r.start_s), r.prompt_tokens, r.output_tokens,
                    r.cached_tokens)
    got = failed(compare(p, fast))
    assert {"arrival.rate", "arrival.interarrival_ks"} <= got
    assert not {"prompt_tokens.ks", "output_tokens.ks", "cached_token_ratio"} & got


def test_smoothed_arrivals_fail_burstiness_alone_of_the_arrival_checks():
    p = production()
    r = replay_of(p)
    span = r.start_s[-1] - r.start_s[0]
    even = r.start_s[0] + np.linspace(0, span, len(p))  # same rate, no bursts
    rep = compare(p, Timeline(even, even + (r.end_s - r.start_s), r.prompt_tokens, r.output_tokens, r.cached_tokens))
    got = failed(rep)
    assert {"arrival.cv", "arrival.interarrival_ks", "arrival.idc_10s"} <= got and "arrival.rate" not in got


@pytest.mark.parametrize("column,factor", [("prompt_tokens", 0.8), ("output_tokens", 1.2)])
def test_token_lengths_after_redaction_drift_alone(column, factor):
    p = production()
    r = replay_of(p)
    changed = (getattr(r, column) * factor).astype(np.int64)
    kw = {column: changed}
    if column == "prompt_tokens":
        kw["cached_tokens"] = np.minimum(r.cached_tokens, changed)
    rep = compare(p, replay_of(p, **kw))
    got = failed(rep) - {"cached_token_ratio"}  # fewer prompt tokens raise the cached share too
    assert got == {f"{column}.ks", f"{column}.mean"}
    assert any(f"{column}.mean drifted" in m for m in rep["failures"])


def test_missing_data_is_skipped_with_the_side_named():
    p = production()
    r = replay_of(p, cached_tokens=np.full(len(p), -1))
    no_latency = Timeline(p.start_s, np.full(len(p), np.nan), p.prompt_tokens, p.output_tokens, p.cached_tokens)
    rep = compare(no_latency, r)
    checks = {c["name"]: c for c in rep["checks"]}
    assert checks["cached_token_ratio"]["skipped"] == "no data on the replay side"
    assert checks["concurrency.mean"]["skipped"] == "no data on the production side"
    assert rep["passed"]


def test_concurrency_is_exact_for_a_known_schedule():
    # two overlapping requests then one alone: 1 in flight for 1 s, 2 for 1 s, 1 for 2 s, 0 for 1 s, 1 for 1 s
    t = Timeline(np.array([0.0, 1.0, 5.0]), np.array([4.0, 2.0, 6.0]), np.ones(3, np.int64), np.ones(3, np.int64),
                 np.full(3, -1))
    c = concurrency(t, window_s=2.0)
    assert c["mean"] == pytest.approx((1 + 2 + 2 + 0 + 1) / 6)
    assert c["p95"] == pytest.approx(1.7)  # level 2 holds the top 1/6 of the time, spread over (1, 2]
    assert c["windows"] == pytest.approx([1.5, 1.0, 0.5])


def test_thresholds_are_configurable():
    p = production()
    r = replay_of(p, cached_tokens=(p.cached_tokens * 0.9).astype(np.int64))
    assert "cached_token_ratio" in failed(compare(p, r))
    assert compare(p, r, ReplayThresholds(cached_ratio_pp=10.0))["passed"]


def test_format_report_lists_every_property():
    p = production()
    text = format_report(compare(p, replay_of(p, cached_tokens=p.cached_tokens // 3)))
    assert text.startswith("replay vs production: FAILED")
    assert "FAIL cached_token_ratio" in text and "ok   arrival.cv" in text


def test_production_log_round_trips_and_replay_records_become_a_timeline(tmp_path):
    log = ProductionLog()
    log.add(0.0, 1.5, 100, 20, 64)
    log.add(2.0, None, 50, 10, None)
    log.add_many(np.array([3.0, 4.0]), np.array([7, 8]), np.array([1, 2]))
    (tmp_path / "production.parquet").write_bytes(log.to_parquet())
    t = read_production(tmp_path)
    assert t.start_s.tolist() == [0.0, 2.0, 3.0, 4.0] and t.end_s[0] == 1.5 and np.isnan(t.end_s[1:]).all()
    assert t.prompt_tokens.tolist() == [100, 50, 7, 8] and t.cached_tokens.tolist() == [64, -1, -1, -1]
    with pytest.raises(FileNotFoundError, match="rebuild"):
        read_production(tmp_path / "missing")

    def rec(sent, end, status, cached):
        return RequestRecord(request_id="x", step_id="s", scheduled_s=sent, sent_s=sent, first_token_s=None,
                             end_s=end, ttft_s=None, itl_s=[], e2e_s=None, prompt_tokens=30, output_tokens=5,
                             status=status, cached_tokens=cached)
    r = replay_timeline([rec(0.0, 1.0, "ok", 16), rec(0.5, None, "error", None)])
    assert r.output_tokens.tolist() == [5, -1] and r.cached_tokens.tolist() == [16, -1] and np.isnan(r.end_s[1])
