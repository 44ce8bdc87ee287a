"""`emulator calibrate` end to end: a measured curve of an engine with hidden factors in, close factors out, versioned.

The "real" endpoint is the emulator with hidden efficiency factors (``hidden_factors_seed``), measured through
`autoresearch replay capacity`; the calibrator sees only that command's output directory. The hidden factors are
computed here, by the test, to judge the fit: nothing passes them to the calibrator.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoresearch_dagster.cli import main
from autoresearch_dagster.emulator import calibrations
from autoresearch_dagster.emulator.cost import Efficiency, hidden_efficiency
from autoresearch_dagster.emulator.measured import read_measured
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import SpecError, load_endpoint

from ..agents.helpers import long_prompt_pool

HIDDEN_SEED = 5


def _spec(tmp: Path, name: str = "small", **engine_options) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": "small", "model": "llama-3.1-8b", "hardware": {"gpu": "H100", "count": 1},
                                    "sla": "ttft_p99<=8s,tpot_p99<=40ms,errors<=1%", "server_config": {},
                                    "engine_options": engine_options}))
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """`replay capacity` of the hidden-factor endpoint, then `emulator calibrate` on its output directory."""
    tmp = tmp_path_factory.mktemp("cal")
    pool = long_prompt_pool(tmp, n=300)
    spec = _spec(tmp, hidden_factors_seed=HIDDEN_SEED)
    assert main(["replay", "capacity", "--pool", str(pool.path), "--engine", "emulator", "--endpoint", str(spec),
                 "--out", str(tmp / "cap"), "--step-duration", "30", "--min-completed", "30", "--measure", "quick",
                 "--max-steps", "10", "--start-rps", "0.5"]) in (0, 1)
    return tmp, spec


def test_calibration_recovers_the_hidden_factors_from_the_measured_curve_only(measured, capsys):
    tmp, spec = measured
    capsys.readouterr()
    rc = main(["emulator", "calibrate", "--endpoint", str(spec), "--measured", str(tmp / "cap"),
               "--lake", str(tmp / "lake"), "--max-evals", "30"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "residual" in out and "ttft_ms.p50" in out and "stored calibration v1" in out
    cal = calibrations.latest(tmp / "lake", "small")
    assert cal is not None and cal.version == 1 and cal.reason == "cli"
    assert cal.engine == "emulator" and cal.engine_version.startswith("emulator-")  # from summary.json
    hidden, default = hidden_efficiency(HIDDEN_SEED), Efficiency()
    fitted_off, default_off = [], []
    for k in ("gemm_mfu", "mbu"):
        assert cal.params[k] == pytest.approx(getattr(hidden, k), rel=0.10), k
        fitted_off.append(abs(cal.params[k] / getattr(hidden, k) - 1))
        default_off.append(abs(getattr(default, k) / getattr(hidden, k) - 1))
    assert sum(fitted_off) < sum(default_off)  # closer to the hidden factors than the documented defaults it started from
    assert sum(cal.error_after.values()) < sum(cal.error_before.values())
    assert all({"rate_rps"} < set(r) for r in cal.residuals)
    rows = open_lake(tmp / "lake").query("SELECT version, reason, engine_version, success FROM calibrations")
    assert rows[0][:3] == (1, "cli", cal.engine_version)


def test_versions_are_kept_and_an_emulator_endpoint_runs_on_the_latest_when_asked(measured, capsys):
    tmp, spec = measured
    lake = tmp / "lake2"
    for _ in range(2):
        assert main(["emulator", "calibrate", "--endpoint", str(spec), "--measured", str(tmp / "cap"), "--lake",
                     str(lake), "--max-evals", "3"]) == 0
    assert [v for v, _ in calibrations.versions(lake / "_calibrations" / "small")] == [1, 2]
    v2 = calibrations.latest(lake, "small")
    assert v2.version == 2 and json.loads(Path(v2.path).read_text())["version"] == 2
    asked = load_endpoint(_spec(tmp, "asked", calibration="latest", calibration_lake=str(lake)))
    assert EmulatorEngine(asked).efficiency == v2.to_efficiency()
    by_file = load_endpoint(_spec(tmp, "by_file", calibration=str(lake / "_calibrations" / "small" / "v1.json")))
    assert EmulatorEngine(by_file).efficiency == calibrations.load(lake / "_calibrations" / "small" / "v1.json").to_efficiency()
    with pytest.raises(SpecError, match="choose one"):
        EmulatorEngine(load_endpoint(_spec(tmp, "both", calibration="latest", hidden_factors_seed=3)))
    with pytest.raises(SpecError, match="has no calibration"):
        EmulatorEngine(load_endpoint(_spec(tmp, "none", calibration="latest", calibration_lake=str(tmp / "empty"))))


def test_a_stored_version_missing_a_newer_factor_completes_it_with_the_default(tmp_path):
    eff = calibrations.efficiency_of({"mbu": 0.5, "not_a_factor": 3.0})
    assert eff.mbu == 0.5 and eff.gemm_mfu == Efficiency().gemm_mfu


def test_the_noise_command_output_is_a_measured_curve(tmp_path):
    runs = [{"run_id": f"r{i}", "valid": True, "capacity_interp_rps": c, "config": {"chunked_prefill_size": 4096},
             "engine_version": "v9", "steps": [{"rate_rps": 1.0, "meets_sla": True, "ttft_ms": {"p50": 10.0}}]}
            for i, c in enumerate((4.0, 5.0, 6.0))]
    (tmp_path / "noise.json").write_text(json.dumps({"median": 5.0, "engine": "sglang", "run_details": runs}))
    curve = read_measured(tmp_path)
    assert curve.kind == "noise" and curve.config == {"chunked_prefill_size": 4096} and curve.engine_version == "v9"
    assert "r1" in curve.notes[0]


@pytest.mark.parametrize("setup, args, message", [
    (None, [], "does not exist"),
    ("empty", [], "holds no summary.json"),
    ("badjson", [], "not valid JSON"),
    ("nosteps", [], "no 'steps' list"),
    ("toofew", [], "a calibration needs at least 2"),
    ("ok", ["--params", "warp_speed"], "cannot calibrate warp_speed"),
    ("ok", ["--below-knee", "2"], "--below-knee must be in"),
    ("ok", ["--restarts", "-1"], "--restarts must be >= 0"),
])
def test_calibrate_user_errors_are_one_line_and_exit_2(tmp_path, capsys, setup, args, message):
    spec = _spec(tmp_path)
    d = tmp_path / "m"
    step = {"rate_rps": 1.0, "meets_sla": True, "ttft_ms": {"p50": 10.0}, "tpot_ms": {"p50": 5.0}}
    if setup:
        d.mkdir()
        payload = {"empty": None, "badjson": "{", "nosteps": json.dumps({"x": 1}),
                   "toofew": json.dumps({"steps": [step]}),
                   "ok": json.dumps({"steps": [step, {**step, "rate_rps": 2.0}, {**step, "rate_rps": 4.0}]})}[setup]
        if payload is not None:
            (d / "summary.json").write_text(payload)
    rc = main(["emulator", "calibrate", "--endpoint", str(spec), "--measured", str(d), "--lake", str(tmp_path / "l"),
               *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1


def test_emulator_serve_runs_on_the_calibration_the_spec_names(measured, tmp_path):
    from autoresearch_dagster.emulator.server import EmulatorServer

    tmp, spec = measured
    lake = tmp / "lake3"
    assert main(["emulator", "calibrate", "--endpoint", str(spec), "--measured", str(tmp / "cap"), "--lake",
                 str(lake), "--max-evals", "2"]) == 0
    ep = load_endpoint(_spec(tmp_path, "served", calibration="latest", calibration_lake=str(lake)))
    assert EmulatorServer(ep, None).core.cost.eff == calibrations.latest(lake, "small").to_efficiency()


def test_the_calibration_replays_the_pool_as_the_engine_was_sent_it(measured, capsys):
    """An endpoint whose engine gets an adapted pool (outputs capped by a gateway) is calibrated on that pool."""
    tmp, _ = measured
    spec = _spec(tmp, "capped", hidden_factors_seed=HIDDEN_SEED, adapt_pool={"max_output_tokens": 64})
    capsys.readouterr()
    assert main(["emulator", "calibrate", "--endpoint", str(spec), "--measured", str(tmp / "cap"), "--max-evals", "1",
                 "--restarts", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pool adapted to the endpoint's limits" in out and "capped output" in out
