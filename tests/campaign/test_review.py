"""Approval gates the deploy artifact: an approval of the latest best config writes it, a stale package is
refused, a rejection writes nothing; every decision records who decided on which package."""
import datetime as dt
import json

import pytest

from autoresearch_dagster.campaign.review import approvals, package_hash, record_approval, write_review_package
from autoresearch_dagster.campaign.state import CampaignState, Era
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import SpecError, config_hash

from ..agents.helpers import small_endpoint

ORIGINAL = {"chunked_prefill_size": 8192}
BEST = {"chunked_prefill_size": 8192, "enable_mixed_chunk": True}


def _era(index, config, median, reason="promotion"):
    return Era(index=index, config=config, config_hash=config_hash(config), reason=reason, set_at="2026-01-01",
               noise={"median": median, "capacities": [median] * 3, "cv": 0.01},
               replication={"ratio": 1.2, "replicated": True} if index else None,
               source_experiment_id=f"e{index}" if index else None, delta={"enable_mixed_chunk": True} if index else {})


def _state(campaign_id="c1", eras=None):
    return CampaignState(campaign_id=campaign_id, endpoint="small", created_at="2026-01-01", settings={},
                         pool_hash="p", sla="ttft_p99<=8s", correctness_hash="x", engine="emulator", gpus=1,
                         eras=eras or [_era(0, ORIGINAL, 5.0, "original"), _era(1, BEST, 6.0)])


def _package(tmp_path, state):
    """A finished campaign's directory: its state.json and the review package of its best config."""
    camp = tmp_path / "campaign"
    state.save(camp / "state.json")
    best = max(state.eras, key=lambda e: e.noise["median"])
    report = {"campaign_id": state.campaign_id, "endpoint": "small", "sla": state.sla, "original_config": ORIGINAL,
              "best_config": best.config, "best_config_hash": best.config_hash, "gain": 1.2, "gain_ci": [1.1, 1.3],
              "gain_confidence": 0.9, "original_rps_per_gpu": 5.0, "final_rps_per_gpu": 6.0, "gpu_savings": None,
              "lossy": False, "correctness": [], "open_questions": [], "ended_because": "budget: 3 experiments",
              "experiments": [],
              "eras": [{"index": e.index, "reason": e.reason, "config_hash": e.config_hash,
                        "capacity_rps": e.noise["median"], "source_experiment_id": e.source_experiment_id,
                        "delta": e.delta, "replication": e.replication} for e in state.eras]}
    return write_review_package(report, state, small_endpoint(), camp / "review")


def test_approving_the_latest_package_writes_the_deploy_artifact(tmp_path):
    review = _package(tmp_path, _state())
    lake = open_lake(tmp_path / "lake")
    row = record_approval(review, who="ops-lead", decision="approve", note="canary first", results=lake)
    deploy = json.loads((review / "deploy" / "deploy.json").read_text())
    assert row["deploy_path"] == str(review / "deploy")
    assert deploy["package_hash"] == package_hash(review) == row["package_hash"]
    assert deploy["approved_by"] == "ops-lead" and deploy["approved_at"] == row["recorded_at"]
    assert deploy["config_hash"] == config_hash(BEST)
    assert deploy["config_diff"] == {"enable_mixed_chunk": [None, True]}
    launch = (review / "deploy" / "launch.sh").read_text()
    assert "--enable-mixed-chunk" in launch and deploy["launch_command"] in launch
    assert "ops-lead" in launch and row["package_hash"] in launch
    lake.refresh_views()
    assert lake.query("SELECT who, decision, package_hash FROM approvals") == [
        ("ops-lead", "approve", row["package_hash"])]


def test_a_rejected_package_deploys_nothing_but_is_recorded(tmp_path):
    review = _package(tmp_path, _state())
    for decision in ("reject", "request_changes"):
        row = record_approval(review, who="sre", decision=decision)
        assert row["deploy_path"] is None
    assert not (review / "deploy").exists()
    assert [a["decision"] for a in approvals(review)] == ["reject", "request_changes"]
    assert {a["package_hash"] for a in approvals(review)} == {package_hash(review)}


def test_a_stale_package_is_refused(tmp_path):
    review = _package(tmp_path, _state())
    # the campaign went on: a later promotion is now its best config, the package still proposes the old one
    moved_on = _state(eras=[*_state().eras, _era(2, {**BEST, "schedule_conservativeness": 0.8}, 7.0)])
    moved_on.save(tmp_path / "campaign" / "state.json")
    with pytest.raises(SpecError, match=f"stale review package.*best config is now {moved_on.eras[2].config_hash}"):
        record_approval(review, who="ops-lead", decision="approve")
    # a new campaign in the same directory
    _state(campaign_id="c2").save(tmp_path / "campaign" / "state.json")
    with pytest.raises(SpecError, match="stale review package.*holds campaign c2"):
        record_approval(review, who="ops-lead", decision="approve")
    assert not (review / "deploy").exists() and approvals(review) == []
    # a rejection of a stale package is still a decision worth keeping
    assert record_approval(review, who="ops-lead", decision="reject")["deploy_path"] is None


def test_a_package_of_an_older_campaign_in_the_lake_is_refused(tmp_path):
    review = _package(tmp_path, _state())
    lake = open_lake(tmp_path / "lake")
    lake.append_rows({"campaign_results": [{"campaign_id": "c-later", "best_config_json": "{}",
                                            "finished_at": dt.datetime(2030, 1, 1)}]},
                     endpoint="small")
    lake.refresh_views()
    with pytest.raises(SpecError, match="latest finished campaign is c-later"):
        record_approval(review, who="ops-lead", decision="approve", results=lake)
