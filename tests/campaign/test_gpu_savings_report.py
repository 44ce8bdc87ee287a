"""A campaign on an autoscaled endpoint ends by showing its capacity gain as GPUs saved under the real demand curve:
the best config and the original replay the production demand, and the end table, campaign.json, the review
package and the lake's campaign_results row carry the comparison."""
import json

import numpy as np

from autoresearch_dagster.campaign.report import format_report
from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool

from ..agents.helpers import small_endpoint
from .helpers import runner, settings

AUTO = {"min_replicas": 1, "max_replicas": 6, "metric": "in_flight", "target": 24, "decision_interval_s": 5,
        "cold_start_s": 10, "scale_down_cooldown_s": 20}
CAPPED, UNCAPPED = {"max_running_requests": 6}, {}  # 6 at a time: more replicas for the burst


def _burst_pool(tmp):
    rng = np.random.default_rng(0)
    arr = np.sort(np.concatenate([rng.uniform(a, b, int((b - a) * r)) for a, b, r in
                                  [(0, 60, 2), (60, 120, 12), (120, 180, 2)]]))  # whole 60 s intervals
    arr[0] = 0.0
    rows = [PoolRequest(id=f"q{i}", arrival_s=float(a), conversation_id=f"c{i}", turn=0, api="chat",
                        messages=[{"role": "user", "content": f"question {i}"}], prompt=None, tools=None,
                        tool_choice=None, response_format=None, sampling={}, prompt_tokens=2000, output_tokens=300,
                        block_hashes=[], block_tokens=64, split="serving") for i, a in enumerate(arr)]
    return read_pool(write_pool(rows, tmp / "pool", {"token_counter": "test"}))


def _noise(median: float, gpus_held: float) -> dict:
    caps = [median * f for f in (0.98, 1.0, 1.01, 0.99, 1.02)]
    return {"noise_id": f"n-{median}", "median": median, "ci_low": min(caps), "ci_high": max(caps), "cv": 0.015,
            "capacities": caps, "margin": 0.02, "runs": 5, "gpus_held": gpus_held}


def test_a_campaign_on_an_autoscaled_endpoint_ends_with_the_gpus_its_best_config_saves(tmp_path):
    ep = small_endpoint(model="gemma-moe-26b-a4b", hardware={"gpu": "H200", "count": 1}, sla="ttft_p99<=1000ms",
                        server_config=CAPPED, autoscaling=AUTO)
    s = settings()
    s.gpu_savings_runs = 2
    lines: list[str] = []
    r = runner(tmp_path, settings_=s, endpoint=ep, pool=_burst_pool(tmp_path), say=lines.append)
    assert r.harness().demand_replay is False  # capacity-only experiments: the comparison runs at the end
    r.state.original.noise = _noise(10.0, 2.5)  # the measured eras' capacities stand in: this test is about the end
    era = r.set_baseline(UNCAPPED, experiment_id=None)
    era.noise, era.replication = _noise(13.0, 2.0), {"replicated": True, "ratio": 1.3}
    r._end("test")
    spent = r.state.spent["gpu_seconds"]
    report = r.finish()
    g = report["gpu_savings"]
    assert g["runs_baseline"] == g["runs_candidate"] == 2 and g["candidate_hash"] == era.config_hash
    assert g["gpu_seconds_ratio"] < 0.95 and g["mean_gpus_saved"] > 0.2 and g["ci_low"] <= g["ci_high"]
    assert r.state.spent["gpu_seconds"] == spent + g["gpu_seconds_spent"]  # the replays are paid for
    # per GPU over the GPUs each fleet held at capacity, not one replica's
    assert (report["original_rps_per_gpu"], report["final_rps_per_gpu"]) == (4.0, 6.5)
    table = format_report(report)
    assert f"GPUs saved under the real demand curve: {g['mean_gpus_saved']:.2f} GPUs on average" in table
    assert json.loads((tmp_path / "campaign" / "campaign.json").read_text())["gpu_savings"]["gpu_seconds_ratio"] \
        == g["gpu_seconds_ratio"]
    review = tmp_path / "campaign" / "review"
    assert json.loads((review / "review.json").read_text())["gpu_savings"]["mean_gpus_saved"] == g["mean_gpus_saved"]
    assert "**GPUs saved under the real demand curve**" in (review / "README.md").read_text()
    lake = r.results
    assert lake.query("SELECT demand_gpu_seconds_ratio FROM campaign_results")[0][0] == g["gpu_seconds_ratio"]
    assert lake.query("SELECT count(*) FROM runs WHERE purpose = 'gpu_savings' AND campaign_id = ?",
                      [r.state.campaign_id]) == [(4,)]
    again = r.finish()  # a second report reads the comparison back: nothing is replayed again
    assert again["gpu_savings"] == json.loads(json.dumps(g))
    assert lake.query("SELECT count(*) FROM runs WHERE purpose = 'gpu_savings'") == [(4,)]
