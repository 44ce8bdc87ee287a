"""CLI smoke tests: `noise`, `experiment run` and `sql`, over a fake engine and over the real emulator."""
from __future__ import annotations

import json

import yaml

from autoresearch_dagster.cli import main

from .helpers import SMALL


def test_experiment_run_prints_and_writes_the_verdict(files, fake_engine, capsys):
    ep, cand, pool, tmp = files
    rc = main(["experiment", "run", "--endpoint", str(ep), "--candidate", str(cand), "--pool", str(pool),
               "--out", str(tmp / "exp"), "--lake", str(tmp / "lake"), *SMALL])
    assert rc == 0
    out = capsys.readouterr().out
    assert "VERDICT: BETTER (confirmed)" in out and "90% CI" in out
    v = json.loads((tmp / "exp" / "verdict.json").read_text())
    for key in ("verdict", "ratio_median", "ci_low", "ci_high", "margin", "runs_baseline", "runs_candidate",
                "lossy", "correctness", "invalid_reasons"):
        assert key in v
    assert v["verdict"] == "better" and 1.1 < v["ratio_median"] < 1.3 and v["ci_low"] > 1 + v["margin"]
    assert v["runs_baseline"] == 10 and v["lossy"] is False and v["correctness"] is None and v["confidence"] == 0.9
    assert len(json.loads((tmp / "exp" / "experiment.json").read_text())["runs"]) == 20

    capsys.readouterr()
    assert main(["sql", "SELECT verdict, confirmed FROM verdict_history WHERE stage LIKE 'confirmation%'",
                 "--lake", str(tmp / "lake"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"verdict": "better", "confirmed": True}]
    assert main(["sql", "SELECT round(gain, 2) AS gain FROM campaign_gain", "--lake", str(tmp / "lake")]) == 0
    assert "(1 row)" in capsys.readouterr().out


def test_noise_writes_noise_json(files, fake_engine, capsys):
    ep, _, pool, tmp = files
    assert main(["noise", "--endpoint", str(ep), "--pool", str(pool), "--runs", "5", "--out", str(tmp / "n"),
                 "--no-lake", *SMALL]) == 0
    n = json.loads((tmp / "n" / "noise.json").read_text())
    assert n["runs"] == 5 and len(n["capacities"]) == 5 and 0 <= n["capacity_cv"] < 0.1
    assert n["ci_low"] <= n["median"] <= n["ci_high"]
    assert "capacity CV" in capsys.readouterr().out


def test_user_errors_exit_2(files, capsys):
    ep, cand, pool, tmp = files
    assert main(["noise", "--endpoint", str(ep), "--pool", str(pool), "--runs", "3", "--out", str(tmp)]) == 2
    assert main(["experiment", "run", "--endpoint", str(tmp / "missing.yaml"), "--candidate", str(cand),
                 "--out", str(tmp)]) == 2
    bad = tmp / "bad.yaml"
    bad.write_text("no_such_knob: 1\n")
    assert main(["experiment", "run", "--endpoint", str(ep), "--candidate", str(bad), "--out", str(tmp)]) == 2
    assert "no_such_knob" in capsys.readouterr().err


def test_real_emulator_experiment_detects_a_clearly_worse_config(files, capsys):
    """End to end on the emulator (virtual time): capping running requests at 2 must lose capacity."""
    ep, _, _, tmp = files
    demo = yaml.safe_load(ep.read_text()) | {"sla": "ttft_p99<=3000ms,tpot_p99<=60ms,errors<=1%"}
    ep.write_text(yaml.safe_dump(demo))
    cand = tmp / "worse.yaml"
    cand.write_text(yaml.safe_dump({"max_running_requests": 2}))
    rc = main(["experiment", "run", "--endpoint", str(ep), "--candidate", str(cand), "--pool", str(tmp / "pool"),
               "--out", str(tmp / "emu"), "--no-lake", "--repeats", "3", "--max-repeats", "3",
               "--step-duration", "10", "--min-completed", "10", "--resolution", "0.05", "--start-rps", "2"])
    assert rc == 0
    v = json.loads((tmp / "emu" / "verdict.json").read_text())
    assert v["verdict"] == "worse", v
    # 3 runs per arm, plus 3 fresh confirmation runs each when those 3 leave it undecided but promising
    assert v["ratio_median"] < 0.85 and v["runs_baseline"] == v["runs_candidate"] in (3, 6)
    runs = json.loads((tmp / "emu" / "experiment.json").read_text())["runs"]
    assert all(r["engine"] == "emulator" and r["engine_version"].startswith("emulator") for r in runs)
    assert all(r["server_info"].get("max_running_requests") == 2 for r in runs if r["arm"] == "candidate")


def test_capacity_flags_reach_the_capacity_settings():
    import argparse

    from autoresearch_dagster.cli._experiments_common import capacity_settings
    args = argparse.Namespace(measure="standard", step_duration=90.0, min_completed=None, resolution=None, start_rps=None,
                              hold_e2e_multiple=10.0)
    s = capacity_settings(args)
    assert s.step_duration_s == 90.0 and s.hold_e2e_multiple == 10.0 and s.min_completed == 100
