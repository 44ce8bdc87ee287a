"""Calibrate -> pre-screen -> verify in a campaign: the surrogate starts from the stored calibration, the calibrated
emulator screens a proposer's candidates, every verified experiment records the emulator's prediction beside the
measurement, the error report reads it by knob family, and a drifting error re-calibrates.

The "real" engine is the emulator with hidden factors (``hidden_factors_seed`` in the runner's endpoint), which the
surrogate never sees.
"""
import json

import pytest

from autoresearch_dagster.agents.proposal import Proposal, Session
from autoresearch_dagster.campaign.state import CampaignSettings
from autoresearch_dagster.cli import main
from autoresearch_dagster.emulator import calibrations
from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.spec import CampaignBudget

from autoresearch_dagster.campaign.loop import CampaignRunner
from autoresearch_dagster.emulator.core import emulator_version
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.memory import Memory
from autoresearch_dagster.results import open_lake

from ..agents.helpers import long_prompt_pool, small_endpoint
from .helpers import TINY


class Optimist:
    """A proposer (as an LLM session might be) that predicts +30% for each of its ideas. On this decode-bound SLA the
    emulator sees a large gain in speculative decoding and none in the other two (a stream interval of 2 or
    longest-prefix-match scheduling change nothing it models on traffic without shared prefixes)."""
    name = "optimist"
    ideas = {"eagle": {"speculative_algorithm": "EAGLE"}, "stream": {"stream_interval": 2},
             "lpm": {"schedule_policy": "lpm"}}

    def propose(self, brief, tools):
        return Session(proposer=self.name, direction=brief.direction, proposals=[Proposal(
            id=f"{pid}-{brief.round}", endpoint=brief.endpoint, proposer=self.name, source="script",
            direction=brief.direction, explanation="an idea the proposer is sure of",
            intervention={"changes": [{"knob": k, "value": v} for k, v in change.items()]},
            prediction={"capacity_ratio": 1.3, "ratio_low": 1.1, "ratio_high": 1.5, "basis": "the proposer's belief"},
            falsification="refuted if not better") for pid, change in self.ideas.items()])


@pytest.fixture(scope="module")
def grounded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grounding")
    ep = small_endpoint(engine_options={"hidden_factors_seed": 5}, sla="ttft_p99<=30s,tpot_p99<=25ms,errors<=1%")
    settings = CampaignSettings(
        directions_per_round=1, experiments_per_round=2, search_trials=0, diagnosis_probes=False, prescreen=True, prescreen_pool=8,
        recalibrate_window=1, recalibrate_error=0.0,  # every verified experiment counts as drift: the path is exercised
        budget=CampaignBudget(max_experiments=1, max_concurrent_gpus=1))
    r = CampaignRunner(ep, long_prompt_pool(tmp), engine=EmulatorEngine(ep), out_dir=tmp / "campaign", settings=settings,
                       measurement=TINY.with_overrides(max_steps=16, start_rps=0.25), results=open_lake(tmp / "lake"),
                       memory=Memory(tmp / "memory"), proposers=[Optimist()])
    start = calibrations.save(r.results.root, calibrations.StoredCalibration(
        endpoint="small", engine="emulator", engine_version=emulator_version(), model="llama-3.1-8b", gpu="H100", gpus=1,
        config_hash="-", pool_hash="-", reason="cli", source="a measured curve", params={"mbu": 0.75},
        efficiency=Efficiency(mbu=0.75).__dict__, error_before={}, error_after={}, points=3, n_evals=1, success=True),
        results=r.results)
    return tmp, r, r.run(), start


def test_the_surrogate_starts_from_the_stored_calibration_and_stores_its_own_fits(grounded):
    _, r, report, start = grounded
    assert report["calibration"]["start_version"] == start.version == 1
    reasons = [x[0] for x in r.results.query("SELECT reason FROM calibrations ORDER BY version")]
    assert reasons[0] == "cli" and "campaign" in reasons  # the era's fit on its noise run is the next version
    assert calibrations.latest(r.results.root, "small").version == len(reasons)


def test_the_calibrated_emulator_screens_the_candidates_it_sees_no_gain_in(grounded):
    tmp, r, report, _ = grounded
    screen = json.loads((tmp / "campaign" / "rounds" / "001" / "prescreen.json").read_text())
    assert screen["floor"] == pytest.approx(1 + r.state.original.noise["margin"])  # prescreen_gain 1.0
    pred = screen["predictions"]
    assert all(pred[p]["feasible"] and pred[p]["ratio"] >= screen["floor"] for p in screen["kept"])
    assert all(not pred[p]["feasible"] or pred[p]["ratio"] < screen["floor"] for p in screen["screened"])
    assert {p.split("-")[0] for p in screen["screened"]} >= {"stream", "lpm"}  # the proposer's +30% notwithstanding
    plan = json.loads((tmp / "campaign" / "rounds" / "001" / "plan.json").read_text())
    assert screen["kept"] and all(any(c["knob"] == "speculative_algorithm" for c in p["intervention"]["changes"])
                                  for p in plan["proposals"])
    ran = [e["proposal_id"] for e in report["experiments"] if e["round"] == 1]
    assert ran and set(ran) <= set(screen["kept"])
    rows = r.results.query("SELECT proposal_id, reasons FROM proposals WHERE status = 'screened'")
    assert {p for p, _ in rows} == set(screen["screened"]) and all("pre-screen" in x[0] for _, x in rows)


def test_verified_experiments_carry_the_emulator_prediction_and_the_error_report_reads_them(grounded, capsys):
    tmp, r, report, _ = grounded
    verified = [e for e in report["experiments"] if e["verdict"] in ("better", "same", "worse")]
    assert verified, "the test needs at least one verified experiment"
    for e in verified:
        emu = e["emulator_prediction"]
        assert emu["ratio"] > 0 and emu["calibration_version"] >= 1 and emu["log_error"] is not None
    rows = r.results.query("SELECT experiment_id, family, emulated_ratio, measured_ratio FROM emulator_errors")
    assert sorted(x[0] for x in rows) == sorted(e["id"] for e in verified)
    assert r.results.query("SELECT family FROM emulator_error_by_family")  # the analysts' view
    # drift (threshold 0 here) re-calibrated on the baseline and the verified candidates' curves
    recal = report["calibration"]["recalibrations"]
    assert recal and recal[0]["drift"]["drifting"]
    assert recal[0]["fitted"] is False or "drift" in [x[0] for x in r.results.query("SELECT reason FROM calibrations")]
    capsys.readouterr()
    assert main(["emulator", "errors", "--endpoint", "small", "--lake", str(r.results.root), "--threshold", "0",
                 "--window", "1"]) == 0
    out = capsys.readouterr().out
    assert "knob family" in out and all(f in out for _, f, _, _ in rows) and "drift: YES" in out


def test_a_calibration_of_another_cost_model_is_kept_but_not_started_from(tmp_path):
    from autoresearch_dagster.campaign.grounding import start_from_store
    from autoresearch_dagster.emulator.cost import cost_model_fingerprint

    lake = open_lake(tmp_path / "lake")
    cal = dict(endpoint="e", engine="emulator", engine_version="t", model="llama-3.1-8b", gpu="H100", gpus=1,
               config_hash="-", pool_hash="-", reason="cli", source="a curve", params={"mbu": 0.7},
               efficiency=Efficiency(mbu=0.7).__dict__, error_before={}, error_after={}, points=3, n_evals=1,
               success=True)
    now = calibrations.save(lake.root, calibrations.StoredCalibration(**cal), results=lake)
    assert now.cost_model == cost_model_fingerprint() and now.current
    assert start_from_store(lake, "e") == (Efficiency(mbu=0.7).__dict__, 1, [])
    old = calibrations.save(lake.root, calibrations.StoredCalibration(**cal, cost_model="an-older-one"), results=lake)
    assert calibrations.latest(lake.root, "e").version == old.version == 2  # kept, readable
    assert not calibrations.load(old.path).current
    assert start_from_store(lake, "e")[:2] == (Efficiency(mbu=0.7).__dict__, 1)  # the older version of this model
    assert start_from_store(lake, "e")[2] == ["v2: fitted under another cost model"]


def test_a_calibration_of_another_engine_release_model_or_gpu_is_not_started_from(tmp_path):
    from autoresearch_dagster.campaign.grounding import start_from_store

    lake = open_lake(tmp_path / "lake")
    cal = dict(endpoint="e", engine="sglang", model="llama-3.1-8b", gpu="H100", gpus=1, config_hash="-",
               pool_hash="-", reason="cli", source="a curve", error_before={}, error_after={}, points=3, n_evals=1,
               success=True)
    for version, mbu in (("0.5.3", 0.7), ("0.5.5", 0.6)):
        calibrations.save(lake.root, calibrations.StoredCalibration(
            **cal, engine_version=version, params={"mbu": mbu}, efficiency=Efficiency(mbu=mbu).__dict__))
    now = dict(engine="sglang", model="llama-3.1-8b", gpu="H100")
    assert start_from_store(lake, "e", **now, engine_version="0.5.5")[:2] == (Efficiency(mbu=0.6).__dict__, 2)
    eff, version, passed = start_from_store(lake, "e", **now, engine_version="0.5.3")  # rolled back: v1 fits
    assert (eff, version) == (Efficiency(mbu=0.7).__dict__, 1) and passed == ["v2: measured on engine_version 0.5.5 "
                                                                             "(now 0.5.3)"]
    assert start_from_store(lake, "e", **now, engine_version="0.5.6")[:2] == (None, None)  # a new release
    assert start_from_store(lake, "e", **{**now, "gpu": "A100"}, engine_version="0.5.5")[:2] == (None, None)
    assert start_from_store(lake, "e", **now, engine_version="unknown")[1] == 2  # not known yet: the newest
