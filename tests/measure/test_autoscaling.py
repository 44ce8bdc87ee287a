"""Autoscaling report of production-shape replays: GPU-seconds, bursts, scale-up latency; the emulated fleet end to
end, a candidate's GPUs saved, a real endpoint's replica gauge, the lake table and the CLI."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import yaml

from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.engines.emulator import STEP_GAP_S, EmulatorEngine
from autoresearch_dagster.engines.replicas import ReplicaWatch, gauge
from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
from autoresearch_dagster.loadgen.records import RequestRecord
from autoresearch_dagster.measure.autoscaling import autoscaling_report, compare, lake_rows
from autoresearch_dagster.measure.shape import run_shape
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import SLA, EndpointSpec, SpecError, load_endpoint

from ..loadgen.helpers import FakePool, FakePoolRequest, burst_pool, FaultServer

SLA_TIGHT = SLA.parse("ttft_p99<=1000ms")
AUTO = {"min_replicas": 1, "max_replicas": 6, "metric": "in_flight", "target": 24, "decision_interval_s": 5,
        "cold_start_s": 10, "scale_down_cooldown_s": 20}


def _rec(i: int, at: float, ttft: float) -> RequestRecord:
    return RequestRecord(request_id=f"q{i}", step_id="s", scheduled_s=at, sent_s=at, first_token_s=at + ttft,
                         end_s=at + ttft + 1, ttft_s=ttft, itl_s=[0.01], e2e_s=ttft + 1, prompt_tokens=10,
                         output_tokens=2, status="ok")


def test_report_from_a_timeseries():
    # held 1, a decision at 20 s launches one more (held 2), serving 2 from 30 s; the wish rises at 18 s
    ts = [{"t_s": float(t), "replicas": 1.0 if t < 20 else 2.0, "replicas_ready": 1.0 if t < 30 else 2.0,
           "replicas_starting": 1.0 if 20 <= t < 30 else 0.0, "desired_replicas": 2.0 if 18 <= t < 40 else 1.0}
          for t in range(0, 50, 2)]
    recs = [_rec(0, 5.0, 0.1), _rec(1, 22.0, 3.0), _rec(2, 25.0, 0.2), _rec(3, 45.0, 0.1)]
    intervals = [{"interval": k, "start_s": k * 10.0, "target_rps": r} for k, r in enumerate([1, 1, 4, 4, 1])]
    rep = autoscaling_report(ts, recs, SLA_TIGHT, intervals=intervals, window_s=50.0, gpus_per_replica=8)
    assert rep["replica_seconds"] == pytest.approx(20 * 1 + 30 * 2)
    assert rep["gpu_seconds"] == pytest.approx(80 * 8) and rep["mean_replicas"] == pytest.approx(1.6)
    assert rep["burst_rule"] == "desired_replicas > serving" and rep["burst_windows"] == [[18.0, 30.0]]
    assert (rep["burst_requests"], rep["burst_sla_misses"], rep["other_requests"], rep["other_sla_misses"]) == (2, 1, 2, 0)
    (up,) = rep["scale_ups"]
    assert up == {"serving_s": 30.0, "from": 1.0, "to": 2.0, "demand_rise_s": 18.0, "decision_s": 20.0,
                  "latency_s": 12.0, "cold_start_s": 10.0}
    assert rep["scale_up_latency_median_s"] == 12.0
    # a gauge of replicas only (a real endpoint without a desired gauge): bursts by the per-replica capacity given
    bare = [{"t": r["t_s"], "replicas": r["replicas_ready"]} for r in ts]
    rep2 = autoscaling_report(bare, recs, SLA_TIGHT, intervals=intervals, window_s=50.0, gpus_per_replica=1,
                              replica_capacity_rps=2.5)
    assert rep2["burst_windows"] == [[20.0, 30.0]]  # 4 req/s > 1 x 2.5; from 30 s two replicas serve 5 req/s
    assert rep2["scale_ups"][0]["demand_rise_s"] == 20.0 and rep2["scale_ups"][0]["decision_s"] is None
    no_rule = autoscaling_report(bare, recs, SLA_TIGHT, intervals=intervals, window_s=50.0, gpus_per_replica=1)
    assert no_rule["burst_rule"] is None and no_rule["burst_sla_misses"] is None
    assert autoscaling_report([{"t_s": 0.0, "num_running": 3}], recs, SLA_TIGHT, intervals=intervals,
                              window_s=50.0, gpus_per_replica=1) is None




def _endpoint(count: int = 1, **auto) -> EndpointSpec:
    return EndpointSpec.model_validate({"name": "auto", "model": "gemma-moe-26b-a4b",
                                        "hardware": {"gpu": "H200", "count": count}, "sla": "ttft_p99<=1000ms",
                                        "autoscaling": {**AUTO, **auto}})


def _replay(ep: EndpointSpec, pool: FakePool, config: dict | None = None):
    dep = EmulatorEngine(ep, noise=NoiseSettings.off()).deploy(config or {})
    res = run_shape(dep, pool, ep.sla, gpus=ep.gpus, model=ep.model, speedup=1.0, interval_s=10.0)
    return res, dep


def test_emulated_fleet_under_a_burst():
    ep = _endpoint(count=2)
    res, dep = _replay(ep, burst_pool(30.0))
    a = res.autoscaling
    events = res.outcomes[0].meta["autoscaling_events"]
    first = events[0]
    assert first["kind"] == "scale_up" and first["t"] == pytest.approx(35.0) and first["ready_s"] == pytest.approx(45.0)
    up = a["scale_ups"][0]
    assert up["serving_s"] == pytest.approx(45.0) and up["decision_s"] == pytest.approx(35.0)
    assert up["cold_start_s"] == pytest.approx(10.0) and 30.0 <= up["demand_rise_s"] <= 35.0
    assert 10.0 <= up["latency_s"] <= 15.0  # decision interval + cold start, from the demand rise
    # SLA misses concentrate in the burst windows (before the new replicas serve)
    assert a["burst_sla_misses"] > 0.5 * a["burst_requests"] > 0 and a["other_sla_misses"] <= 0.02 * a["other_requests"]
    assert all(w[0] >= 30.0 and w[1] <= 46.0 for w in a["burst_windows"])
    # the cool-down releases the replicas: back to one before the replay ends
    assert a["replicas_max"] >= 3 and a["series"]["replicas"][-1] == 1.0 and a["scale_downs"] >= 1
    # GPU-seconds: replicas x GPUs integrated; the deployment's held time (one idle gap at min_replicas) agrees
    assert a["gpu_seconds"] == pytest.approx((dep.held_s - STEP_GAP_S) * 2, rel=1e-6)
    assert a["gpu_seconds"] == pytest.approx(a["replica_seconds"] * 2)
    assert a["window_s"] * 1 * 2 < a["gpu_seconds"] < a["window_s"] * 6 * 2


def test_candidate_with_more_capacity_per_replica_uses_fewer_gpu_seconds():
    ep = _endpoint()
    pool = burst_pool(12.0)
    base, _ = _replay(ep, pool, {"max_running_requests": 12})  # a replica admits 12 at a time: queues grow
    cand, _ = _replay(ep, pool, {})
    c = compare(base.autoscaling, cand.autoscaling)
    assert c["gpu_seconds_ratio"] < 0.9 and c["mean_gpus_saved"] > 0.2
    assert c["gpu_seconds_saved"] == pytest.approx(base.autoscaling["gpu_seconds"] - cand.autoscaling["gpu_seconds"])
    rows = lake_rows(cand.autoscaling, replay_id="as-c", role="candidate", config_hash="h", engine="emulator",
                     speedup=1.0, comparison=c, baseline_replay_id="as-b")["autoscaling"]
    assert rows[0]["gpu_seconds_ratio"] == c["gpu_seconds_ratio"]


def test_spec_errors_are_one_line(tmp_path):
    path = tmp_path / "ep.yaml"
    for auto, msg in [({"min_replicas": 3, "max_replicas": 2, "target": 4}, "max_replicas 2 is below min_replicas 3"),
                      ({"max_replicas": 2, "target": 4, "metric": "kv_usage"}, "kv_usage target is a fraction"),
                      ({"max_replicas": 2, "target": 4, "cold_start": 3}, "cold_start"),
                      ({"max_replicas": 2, "target": 4, "metric": "gpu_util"}, "metric")]:
        path.write_text(yaml.safe_dump({"name": "e", "model": "gemma-moe-26b-a4b", "hardware": {"gpu": "H200"},
                                        "sla": "ttft_p99<=1s", "autoscaling": auto}))
        with pytest.raises(SpecError, match=msg) as e:
            load_endpoint(path)
        assert "\n" not in str(e.value) and "autoscaling" in str(e.value)
    with pytest.raises(SpecError, match="virtual-time emulator only"):
        EmulatorEngine(_endpoint(), mode="http")


class _ReplicaGauge:
    """A stand-in for a real fleet's metrics: 1 replica until 0.6 s after the 10th request reached the server,
    then 2; the autoscaler's desired count is 2 from the 10th request on."""

    def __init__(self, server: FaultServer):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = stand_in.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = server
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/metrics"

    def text(self) -> str:
        arr = self.server.arrivals
        tenth = arr[9][0] if len(arr) >= 10 else None
        ready = 2 if tenth is not None and time.perf_counter() >= tenth + 0.6 else 1
        desired = 2 if tenth is not None else 1
        # one series per deployment (summed), as kube-state-metrics exposes them
        return ("# TYPE fleet_replicas gauge\n"
                f'fleet_replicas{{deployment="a"}} {ready - 1}\nfleet_replicas{{deployment="b"}} 1\n'
                f"fleet_desired_replicas {desired}\n")


def test_real_endpoint_replica_gauge_is_reported_like_the_emulator():
    assert gauge('x{a="1"} 2\nx{a="2"} 3\ny 1\n', "x") == 5.0 and gauge("y 1\n", "x") is None
    srv = FaultServer(token_gap_s=0.001)
    url = srv.start()
    stand_in = _ReplicaGauge(srv)
    try:
        pool = FakePool([FakePoolRequest(id=f"r{i}", arrival_s=i * 0.1, messages=[{"role": "user", "content": "x"}],
                                         output_tokens=2) for i in range(25)])
        dep = ReplicaWatch(HttpDeployment(url, model="m", settings=RunnerSettings(isolate=False, max_send_lag_p99_s=1.0,
                                                                                  scrape_metrics_s=None)),
                           metrics_url=stand_in.url, replicas_metric="fleet_replicas",
                           desired_metric="fleet_desired_replicas", interval_s=0.1)
        res = run_shape(dep, pool, SLA.parse("ttft_p99<=2000ms"), gpus=4, model="m", speedup=1.0, interval_s=1.0,
                        flush_cache=False)
    finally:
        stand_in.http.shutdown()
        srv.stop()
    a = res.autoscaling
    assert a is not None and a["replicas_min"] == 1.0 and a["replicas_max"] == 2.0
    (up,) = a["scale_ups"]
    assert a["burst_rule"] == "desired_replicas > serving" and len(a["burst_windows"]) == 1
    tenth = sorted(r.sent_s for r in res.outcomes[0].records)[9]  # the stand-in's wish rises when it arrives
    assert up["demand_rise_s"] == pytest.approx(tenth, abs=0.25)
    assert 0.5 <= up["latency_s"] <= 0.9 and up["decision_s"] is None  # no starting gauge: no decision time
    # a sample taken after the window's end (a loaded machine's late tick) holds nothing inside the window
    inside = np.asarray(a["series"]["t_s"]) < a["window_s"]
    t = np.asarray(list(np.asarray(a["series"]["t_s"])[inside]) + [a["window_s"]])
    held = np.asarray(a["series"]["replicas"])[inside]
    # and samples taken before the replay's clock started (negative t) hold nothing before 0
    left = np.clip(np.concatenate([[0.0], t[1:-1]]), 0, None)
    right = np.clip(t[1:], 0, None)
    assert a["gpu_seconds"] == pytest.approx(4 * float(np.sum(held * (right - left))))
    assert a["gpu_seconds"] == pytest.approx(4 * (a["window_s"] + (a["window_s"] - up["serving_s"])), abs=4 * 0.15)


def test_replay_shape_cli_reports_autoscaling_and_gpus_saved(tmp_path, capsys):
    from autoresearch_dagster.cli import main
    from autoresearch_dagster.pool.schema import PoolRequest, write_pool

    pool = burst_pool(12.0)
    rows = [PoolRequest(id=r.id, arrival_s=r.arrival_s, conversation_id=None, turn=None, api="chat",
                        messages=r.messages, prompt=None, tools=None, tool_choice=None, response_format=None,
                        sampling={}, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens, block_hashes=[],
                        block_tokens=64, split="serving") for r in pool.rows]
    pool_dir = write_pool(rows, tmp_path / "pool" / "pool").parent
    spec = tmp_path / "ep.yaml"
    spec.write_text(yaml.safe_dump({"name": "auto", "model": "gemma-moe-26b-a4b", "hardware": {"gpu": "H200"},
                                    "sla": "ttft_p99<=1000ms", "server_config": {"max_running_requests": 12},
                                    "autoscaling": AUTO}))
    cand = tmp_path / "cand.yaml"
    cand.write_text("max_running_requests: 64\n")
    out, lake = tmp_path / "out", tmp_path / "lake"
    rc = main(["replay", "shape", "--pool", str(pool_dir), "--engine", "emulator", "--endpoint", str(spec),
               "--speedup", "1", "--interval", "10", "--out", str(out), "--candidate", str(cand), "--lake", str(lake)])
    printed = capsys.readouterr().out
    assert rc in (0, 1)
    assert "autoscaling: " in printed and "GPU-seconds" in printed and "GPUs saved on average" in printed
    summary = json.loads((out / "summary.json").read_text())
    c = summary["autoscaling_comparison"]
    assert c["gpu_seconds_baseline"] == pytest.approx(summary["autoscaling"]["gpu_seconds"])
    assert c["gpu_seconds_candidate"] == pytest.approx(summary["candidate"]["autoscaling"]["gpu_seconds"])
    assert (out / "autoscaling.png").stat().st_size > 10_000
    got = open_lake(lake).query("SELECT role, gpu_seconds, gpu_seconds_ratio, scale_ups FROM autoscaling "
                                "WHERE endpoint = 'auto' ORDER BY role")
    assert [g[0] for g in got] == ["baseline", "candidate"]
    assert got[0][1] == pytest.approx(c["gpu_seconds_baseline"]) and got[1][2] == pytest.approx(c["gpu_seconds_ratio"])
    assert main(["replay", "shape", "--pool", str(pool_dir), "--url", "http://127.0.0.1:9", "--sla", "ttft_p99<=1s",
                 "--out", str(out), "--candidate", str(cand)]) == 2
    assert "--candidate needs --engine emulator" in capsys.readouterr().err
