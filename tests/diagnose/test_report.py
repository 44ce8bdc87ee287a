"""End to end on the virtual-time emulator: scenarios with a known bottleneck, the report files, the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoresearch_dagster.diagnose.hypotheses import BOTTLENECKS
from autoresearch_dagster.diagnose.scenarios import SCENARIOS, run_scenario, scenario

pytest.importorskip("autoresearch_dagster.engines.emulator")

REDUCED = ["admission_limit", "cuda_graph_coverage", "missed_prefix_reuse"]


def test_scenarios_cover_every_bottleneck():
    assert len(SCENARIOS) >= 8
    assert {s.truth for s in SCENARIOS} == set(BOTTLENECKS)


@pytest.mark.parametrize("name", REDUCED)
def test_reduced_scenarios_rank_the_true_bottleneck_first(name, tmp_path):
    res = run_scenario(scenario(name), tmp_path, measurement="short", probes=(name == "missed_prefix_reuse"),
                       profile=(name == "cuda_graph_coverage"))
    assert res.rank == 1, res.top
    top = res.report.hypotheses[0]
    assert top.score > res.report.hypotheses[1].score
    assert top.evidence, "the top hypothesis must cite measured evidence"
    assert top.direction == BOTTLENECKS[name].direction


def test_report_files_json_and_markdown(tmp_path):
    res = run_scenario(scenario("cuda_graph_coverage"), tmp_path, measurement="short", probes=False, profile=True)
    rep = res.report
    md, js = rep.write(tmp_path / "out")
    data = json.loads(js.read_text())
    h0 = data["hypotheses"][0]
    assert set(h0) >= {"bottleneck", "direction", "score", "evidence", "knobs"}
    assert h0["bottleneck"] == "cuda_graph_coverage" and "cuda_graph_max_bs_decode" in h0["knobs"]
    sources = {f["source"] for f in data["findings"]}
    assert {"workload", "curve", "metrics", "profile"} <= sources
    # the profile really came from a trace file the deployment wrote, in SGLang's naming
    assert data["details"]["profile"]["files"][0].endswith(".trace.json.gz")
    assert data["details"]["profile"]["breakdown_share"]["gemm_moe"] > 0.3
    # the small CUDA graph shows: most decode batches run eagerly
    assert data["features"]["m.share_above_graph_bs"] > 0.3
    text = md.read_text()
    for name in ("curve", "engine", "profile", "hypotheses"):
        assert f"({name}.png)" in text and Path(rep.plots[name]).stat().st_size > 1000
    assert "data:image/png;base64," in rep.to_markdown(inline_images=True)


def test_cli_builds_the_pool_and_prints_top_hypotheses(tmp_path, capsys):
    from autoresearch_dagster.cli import main

    logs = tmp_path / "logs.jsonl"
    lines = (Path(__file__).resolve().parents[2] / "examples/logs/demo_chat.jsonl").read_text().splitlines()[:150]
    logs.write_text("\n".join(lines) + "\n")
    spec = tmp_path / "ep.yaml"
    spec.write_text("name: cli-demo\nmodel: gemma-moe-26b-a4b\nhardware: {gpu: H200, count: 1}\n"
                    "sla: 'ttft_p99<=3000ms,tpot_p99<=60ms,errors<=1%'\nworkload: {logs: [logs.jsonl]}\n")
    out = tmp_path / "out"
    rc = main(["diagnose", "--endpoint", str(spec), "--out", str(out), "--measure", "short", "--no-probes", "--no-profile",
               "--memory", ""])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "1. " in printed and (out / "report.md").exists()
    data = json.loads((out / "report.json").read_text())
    assert len(data["hypotheses"]) == len(BOTTLENECKS)
    assert data["details"]["workload"]["n_requests"] > 50
    assert main(["diagnose", "--endpoint", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2


def test_reusing_a_measured_curve_skips_the_search(tmp_path):
    """The Dagster asset passes the noise baseline's curve (a dict) instead of searching again."""
    from autoresearch_dagster.diagnose import diagnose
    from autoresearch_dagster.diagnose.scenarios import build_scenario_pool
    from autoresearch_dagster.engines.emulator import EmulatorEngine

    s = scenario("admission_limit")
    first = run_scenario(s, tmp_path / "a", measurement="short", probes=False, profile=False)
    curve = first.report.details["capacity"]
    assert isinstance(curve, dict) and curve["steps"]
    pool = build_scenario_pool(s, tmp_path / "b")

    class CountingEngine(EmulatorEngine):
        steps = 0

        def deploy(self, config, *, seed=0):
            dep = super().deploy(config, seed=seed)
            run = dep.run_step

            def counted(schedule, **kw):
                CountingEngine.steps += 1
                return run(schedule, **kw)
            dep.run_step = counted
            return dep

    ep = s.endpoint()
    rep = diagnose(ep, pool, engine=CountingEngine(ep), config=s.config, out_dir=tmp_path / "c", capacity=curve,
                   measurement="short", probes=False, profile=False)
    assert CountingEngine.steps == 1  # only the diagnostic step
    assert rep.hypotheses[0].bottleneck == "admission_limit"
    assert rep.details["curve"]["capacity_rps"] == pytest.approx(curve["capacity_rps"])


def test_endpoint_without_profiler_still_gets_a_report(tmp_path):
    from autoresearch_dagster.diagnose import diagnose
    from autoresearch_dagster.diagnose.scenarios import build_scenario_pool
    from autoresearch_dagster.engines.base import EngineError
    from autoresearch_dagster.engines.emulator import EmulatorEngine

    class NoProfiler(EmulatorEngine):
        def deploy(self, config, *, seed=0):
            dep = super().deploy(config, seed=seed)

            def refuse(_dir):
                raise EngineError("this endpoint exposes no /start_profile")
            dep.start_profile = refuse
            return dep

    s = scenario("admission_limit")
    ep = s.endpoint()
    rep = diagnose(ep, build_scenario_pool(s, tmp_path), engine=NoProfiler(ep), config=s.config,
                   out_dir=tmp_path / "r", measurement="short", probes=False, profile=True)
    assert "no /start_profile" in rep.meta["profile"] and rep.details["profile"] is None
    assert rep.hypotheses[0].bottleneck == "admission_limit"
