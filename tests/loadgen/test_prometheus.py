"""One Prometheus reading: ratio gauges averaged over label sets, counters and other gauges summed,
the same in the HTTP runner's in-step scrapes as in diagnosis's bracketing scrapes."""
import pytest

from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
from autoresearch_dagster.loadgen.prometheus import RATIO_GAUGES, MetricsError, parse_prometheus, snapshot
from autoresearch_dagster.loadgen.schedule import build_schedule

from .helpers import METRICS_TEXT, FaultServer, make_pool

# Two DP ranks of one server (SGLang labels each scheduler's samples with its rank).
TWO_RANKS = """\
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m",dp_rank="0"} 0.25
sglang:cache_hit_rate{model_name="m",dp_rank="1"} 0.75
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",dp_rank="0"} 0.6
sglang:token_usage{model_name="m",dp_rank="1"} 0.6
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",dp_rank="0"} 5
sglang:num_running_reqs{model_name="m",dp_rank="1"} 7
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",dp_rank="0"} 1000
sglang:prompt_tokens_total{model_name="m",dp_rank="1"} 3000
"""
EXPECTED = {"sglang:cache_hit_rate": 0.5, "sglang:token_usage": 0.6,  # ratios: the ranks' mean
            "sglang:num_running_reqs": 12.0, "sglang:prompt_tokens_total": 4000.0}  # counts: the ranks' sum


def test_ratio_gauges_average_and_counters_sum_over_label_sets():
    snap = snapshot(TWO_RANKS)
    assert snap == pytest.approx(EXPECTED)
    assert {"cache_hit_rate", "token_usage"} <= RATIO_GAUGES and "num_running_reqs" not in RATIO_GAUGES


def test_in_step_scrapes_read_metrics_by_the_same_rule():
    srv = FaultServer(metrics_text=TWO_RANKS)
    url = srv.start()
    try:
        dep = HttpDeployment(url, settings=RunnerSettings(scrape_metrics_s=0.05, max_send_lag_p99_s=0.25))
        sched = build_schedule(make_pool(["ok"] * 10), [i * 0.05 for i in range(10)], model="m", seed=0)
        out = dep.run_step(sched, step_id="scrape", timeout_s=5.0)
    finally:
        srv.stop()
    assert out.engine_timeseries
    for row in out.engine_timeseries:
        assert {k: row[k] for k in EXPECTED} == pytest.approx(EXPECTED)


def test_prometheus_parse_and_snapshot():
    samples = parse_prometheus(METRICS_TEXT)
    assert len(samples) == 11
    assert dict(samples[-1].labels) == {"a": 'x"y'}
    snap = snapshot(METRICS_TEXT)
    assert snap["sglang:num_queue_reqs"] == 10.0  # summed over ranks
    assert snap["sglang:token_usage"] == pytest.approx(0.8)  # ratio gauges are averaged
    assert snap["sglang:cached_tokens_total"] == 400.0
    assert snap['sglang:cached_tokens_total{cache_source="host"}'] == 100.0
    assert snap["sglang:time_to_first_token_seconds_count"] == 5.0
    assert "sglang:time_to_first_token_seconds_bucket" not in snap
    with pytest.raises(MetricsError, match="line 2"):
        parse_prometheus("ok 1\nthis is not a sample\n")


def test_a_vllm_server_is_read_under_sglangs_names_too():
    # lines as vLLM 0.32's CPU build serves them (labels engine and model_name)
    text = "\n".join([
        '# HELP vllm:num_requests_running Number of requests in model execution batches.',
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 26.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 3.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0449',
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 280064.0',
        'vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 526208.0',
        'vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 0.0'])
    s = snapshot(text)
    assert s["sglang:num_running_reqs"] == 26 and s["sglang:num_queue_reqs"] == 3
    assert s["sglang:token_usage"] == pytest.approx(0.0449) and s["vllm:num_requests_running"] == 26
    assert s["sglang:cached_tokens_total"] / s["sglang:prompt_tokens_total"] == pytest.approx(0.532, abs=1e-3)
    # an SGLang server's own reading is never overwritten by an alias
    both = snapshot(text + "\nsglang:num_running_reqs 5")
    assert both["sglang:num_running_reqs"] == 5
