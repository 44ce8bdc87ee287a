"""The campaign loop end to end on the emulator: it proposes, tests, learns, stops and leaves a report."""
import json
import subprocess
import time

import pytest

from autoresearch_dagster.agents.proposal import Proposal, Session
from autoresearch_dagster.campaign.review import approvals, record_approval
from autoresearch_dagster.campaign.state import CampaignState
from autoresearch_dagster.memory import Memory, MemoryVersionError

from ..agents.helpers import small_endpoint
from .helpers import TINY, runner, settings

CAMPAIGN_KEYS = {"campaign_id", "original_capacity_rps", "final_capacity_rps", "gain", "gain_ci", "best_config",
                 "experiments", "hit_rate", "open_questions", "ended_because"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One campaign run to its end (shared: it is the slow part)."""
    tmp = tmp_path_factory.mktemp("campaign")
    r = runner(tmp, settings_=settings())
    return tmp, r, r.run()


def test_a_campaign_researches_on_its_own_and_ends_with_a_report_and_a_review_package(finished):
    tmp_path, r, report = finished
    assert CAMPAIGN_KEYS <= set(report) and report["ended_because"]
    saved = json.loads((tmp_path / "campaign" / "campaign.json").read_text())
    assert saved["campaign_id"] == report["campaign_id"]
    exps = report["experiments"]
    assert 1 <= len(exps) <= 3 and all({"id", "proposal_id", "source", "intervention", "prediction", "verdict",
                                        "ratio_median"} <= set(e) for e in exps)
    assert all(e["source"] in ("offline", "orchestrator") for e in exps)  # the system's own proposals only
    assert len({e["prediction"]["capacity_ratio"] for e in exps}) > 1 or len(exps) == 1
    assert report["original_capacity_rps"] > 0 and report["final_capacity_rps"] >= report["original_capacity_rps"]
    assert report["gain"] >= 1.0 and report["gain_ci"][0] <= report["gain"] <= report["gain_ci"][1]
    review = tmp_path / "campaign" / "review"
    assert {"README.md", "review.json", "config_diff.json", "launch_command.sh", "evidence.json"} <= {
        p.name for p in review.iterdir()}
    assert "sglang.launch_server" in (review / "launch_command.sh").read_text()
    # every tested proposal's prediction was scored in the lake
    rows = r.results.query("SELECT count(*), count(*) FILTER (WHERE scored) FROM predictions")
    assert rows[0][0] == len(exps)
    assert r.results.query("SELECT count(*) FROM findings")[0][0] >= 1
    # approval is a recorded human action
    row = record_approval(review, who="ops-lead", decision="approve", note="looks right", results=r.results)
    assert approvals(review)[0]["approval_id"] == row["approval_id"]
    assert r.results.query("SELECT who, decision FROM approvals") == [("ops-lead", "approve")]
    st = CampaignState.load(tmp_path / "campaign" / "state.json")
    assert st.status == "ended" and st.phase == "end"
    # the memory is a repository of its own with one commit per closed round, and nothing failed to version
    assert report["memory"] == {"root": str(tmp_path / "memory"), "problems": []}
    history = subprocess.run(["git", "-C", str(tmp_path / "memory"), "log", "--format=%s"], capture_output=True,
                             text=True).stdout.splitlines()
    assert len(history) == len(st.rounds) and all(st.campaign_id in h for h in history)
    # each experiment's fresh baseline anchors are runs of their own (seeds differ between experiments), stable
    # across a resume (derived from the era and the proposal)
    anchor_seeds = [tuple(a["seed"] for a in json.loads(p.read_text())["anchors"])
                    for p in sorted((tmp_path / "campaign" / "rounds").glob("*/experiments/*.json"))]
    anchor_seeds = [a for a in anchor_seeds if a]
    assert len(set(anchor_seeds)) == len(anchor_seeds)
    assert len({x for a in anchor_seeds for x in a}) == sum(len(a) for a in anchor_seeds)
    e = st.experiments[0]
    assert r.experiment_harness(st.eras[e["era"]], e["proposal_id"]).seed == \
        r.experiment_harness(st.eras[e["era"]], e["proposal_id"]).seed != r.harness().seed


class Scripted:
    """A proposer with fixed ideas: a lossy change the gate refuses, then a lossless one."""
    name = "scripted"

    def __init__(self):
        self.calls = 0

    def propose(self, brief, tools):
        self.calls += 1
        ideas = {1: ("lossy", {"quantization": "fp8"}, 1.8), 2: ("mixed", {"enable_mixed_chunk": True}, 1.2)}
        if self.calls not in ideas:
            return Session(proposer=self.name, direction=brief.direction)
        pid, change, ratio = ideas[self.calls]
        return Session(proposer=self.name, direction=brief.direction, proposals=[Proposal(
            id=f"{pid}-{brief.round}", endpoint=brief.endpoint, proposer=self.name, source="script",
            direction=brief.direction, explanation="a scripted idea to test the loop",
            intervention={"changes": [{"knob": k, "value": v} for k, v in change.items()]},
            prediction={"capacity_ratio": ratio, "ratio_low": 1.05, "ratio_high": ratio + 0.2, "basis": "script"},
            falsification="refuted if not better")])


class Unversioned(Memory):
    """A memory whose repository refuses every commit (a broken .git, no git on the PATH)."""

    def commit(self, message):
        raise MemoryVersionError("git commit failed: no space left on device")


def test_a_failed_correctness_gate_is_a_verdict_and_the_loop_goes_on(tmp_path, caplog):
    s = settings(max_experiments=2)
    s.directions_per_round, s.experiments_per_round = 1, 1
    r = runner(tmp_path, settings_=s, proposers=[Scripted()])
    r.memory = Unversioned(r.memory.root)
    report = r.run()
    # a memory that cannot be versioned is warned about and kept in the report, round by round, not swallowed
    assert len(report["memory"]["problems"]) == len(r.state.rounds) == 2
    assert all("no space left" in m for m in report["memory"]["problems"])
    assert "memory not versioned" in caplog.text and len(r.memory.entries(r.endpoint.name)) == 2
    first, second = report["experiments"]
    assert first["intervention"] == {"quantization": "fp8"} and first["verdict"] == "invalid"
    assert first["correctness_passed"] is False and first["score"]["scored"] is False
    assert second["intervention"] == {"enable_mixed_chunk": True} and second["verdict"] != "invalid"
    assert report["ended_because"] == "budget: 2 experiments"
    assert list(r.state.gate_failures.values()) == [["quantization=fp8"]]


def test_budgets_end_the_campaign_cleanly_with_its_state_saved(tmp_path):
    r = runner(tmp_path / "gpu", settings_=settings(max_gpu_hours=0.01))
    report = r.run()
    assert report["ended_because"] == "budget: 0.01 GPU-hours" and report["experiments"] == []
    st = CampaignState.load(tmp_path / "gpu" / "campaign" / "state.json")
    assert st.original.noise and st.spent["gpu_seconds"] > 36  # the noise floor was measured and counted
    late = runner(tmp_path / "late", settings_=settings(max_wall_s=1.0))
    late.measure()  # cut to the deadline's time; the deadline may not have passed yet when it returns
    time.sleep(max(0.0, late.time_left()) + 0.05)
    assert late.plan() is None and late.state.ended_because.startswith("deadline")


class TwoIdeas:
    """A proposer with two lossless ideas in one session."""
    name = "two"

    def propose(self, brief, tools):
        return Session(proposer=self.name, direction=brief.direction, proposals=[Proposal(
            id=f"{pid}-{brief.round}", endpoint=brief.endpoint, proposer=self.name, source="script",
            direction=brief.direction, explanation="a scripted idea to test the budget",
            intervention={"changes": [{"knob": k, "value": v}]},
            prediction={"capacity_ratio": 1.2, "ratio_low": 1.05, "ratio_high": 1.4, "basis": "script"},
            falsification="refuted if not better")
            for pid, k, v in (("mixed", "enable_mixed_chunk", True), ("cons", "schedule_conservativeness", 0.8))])


def test_an_experiment_that_would_overrun_the_gpu_hour_budget_is_not_started(tmp_path):
    s = settings(max_experiments=4)
    s.directions_per_round, s.experiments_per_round = 1, 2
    r = runner(tmp_path, settings_=s, proposers=[TwoIdeas()])
    r.measure()
    noise_s, cost = r.state.era.noise["gpu_seconds"], r.experiment_gpu_seconds()
    assert cost > 0
    # room for one experiment after the noise floor, not for two: the round's second is not started
    r.settings.budget.max_gpu_hours = (noise_s + 1.5 * cost) / 3600
    r.diagnose()
    plan = r.plan()
    assert plan is not None and len(plan.proposals) == 2
    records = r.run_round(plan)
    assert [rec["proposal_id"] for rec in records] == [plan.proposals[0].id]
    r.close(plan, records)
    assert r.state.spent["gpu_seconds"] <= r.settings.budget.max_gpu_hours * 3600
    # and a campaign whose budget cannot pay for the next experiment ends before it plans one
    assert r.plan() is None and "an experiment needs" in r.state.ended_because


def test_an_interrupted_campaign_resumes_where_it_stopped(tmp_path):
    r = runner(tmp_path, settings_=settings(max_experiments=1))
    r.measure()
    r.diagnose()
    plan = r.plan()
    noise_id = r.state.era.noise["noise_id"]
    again = runner(tmp_path, settings_=settings(max_experiments=1))  # a new process on the same directory
    assert again.state.phase == "experiment" and again.current_plan().round == plan.round
    report = again.run()
    assert again.state.original.noise["noise_id"] == noise_id  # not measured twice
    assert report["experiments"][0]["proposal_id"] == plan.proposals[0].id


def test_memory_stops_repeats_across_campaigns(finished):
    tmp, first, _ = finished
    # memory keeps what was not better against a baseline (a "better" is worth a fresh try): a second campaign
    # starting from a baseline the first one ran such experiments against must not propose them again
    era = next(a for a in first.state.eras if any(e["verdict"] != "better" and e["baseline_hash"] == a.config_hash
                                                   for e in first.state.experiments))
    tested = {e["candidate_hash"] for e in first.state.experiments if e["verdict"] != "better"
              and e["baseline_hash"] == era.config_hash}
    ep = small_endpoint(engine_options={"hidden_factors_seed": 5}, server_config=era.config)
    second = runner(tmp / "again", memory=tmp / "memory", pool=first.pool, endpoint=ep)
    second.measure()
    second.diagnose()
    plan = second.plan()
    assert not ({p.config_hash for p in (plan.proposals if plan else [])} & tested)
    remembered = second._tested()  # what the proposers are told not to propose again, and why
    assert tested and tested <= set(remembered)
    assert all(first.state.campaign_id in remembered[h] for h in tested)


def test_the_cli_shows_a_campaign_and_records_an_approval(finished, capsys):
    from autoresearch_dagster.cli import main

    tmp, r, report = finished
    assert main(["campaign", "status", "--out", str(tmp / "campaign")]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "ended" and shown["experiments"] == len(report["experiments"])
    review = tmp / "campaign" / "review"
    assert main(["campaign", "approve", "--review", str(review), "--who", "sre-on-call", "--decision",
                 "request_changes", "--note", "run it on the canary first", "--lake", str(tmp / "lake")]) == 0
    assert approvals(review)[-1]["decision"] == "request_changes"


@pytest.mark.parametrize("argv, message", [
    (["campaign", "status", "--out", "{tmp}/nowhere"], "holds no campaign"),
    (["campaign", "approve", "--review", "{tmp}", "--who", "x", "--decision", "approve"], "not a review package"),
    (["campaign", "approve", "--review", "{tmp}/missing", "--who", "x", "--decision", "approve"], "not a directory"),
    (["campaign", "run", "--endpoint", "examples/endpoints/demo.yaml", "--out", "{tmp}/o", "--proposer", "claude"],
     "ANTHROPIC_API_KEY"),
    (["campaign", "run", "--endpoint", "{tmp}/none.yaml", "--out", "{tmp}/o"], "does not exist"),
])
def test_campaign_user_errors_are_one_line_and_exit_2(argv, message, tmp_path, capsys, monkeypatch):
    from autoresearch_dagster.cli import main

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_noise_floor_that_cannot_be_measured_ends_the_campaign_cleanly(tmp_path, monkeypatch):
    """Noise runs that keep failing (the load search never confirms a capacity) end the campaign with its state
    saved, the attempts' GPU time counted and a report, instead of an exception that loses the campaign."""
    from autoresearch_dagster.engines.base import EngineError
    from autoresearch_dagster.experiments import noise as noise_mod

    def failing(*args, **kwargs):
        err = EngineError("noise: only 4 of 5 baseline runs were valid after 8 attempts: search stopped")
        err.gpu_seconds = 1800.0
        raise err

    monkeypatch.setattr(noise_mod, "measure_noise", failing)
    r = runner(tmp_path)
    report = r.run()
    assert r.state.status == "ended" and report["ended_because"] == "the noise floor of the baseline could not be measured"
    assert report["experiments"] == []
    assert any("could not be measured: noise: only 4 of 5" in q for q in report["open_questions"])
    saved = json.loads((tmp_path / "campaign" / "state.json").read_text())
    assert saved["status"] == "ended" and saved["spent"]["gpu_seconds"] == 1800.0


def test_a_noise_floor_keeps_one_whole_load_curve_for_the_diagnosis_and_the_calibration(tmp_path):
    """The first noise run searches from the profile's start and sees light load to the break; the others start at
    its capacity (half the probes). The era's curve run, which the diagnosis and the calibration read, is that
    first run, not the median one, whose probes are all near the knee."""
    r = runner(tmp_path, settings_=settings(), measurement=TINY.with_overrides(start_rps=0.5))
    era = r.measure()
    rows = r.results.query("SELECT r.run_id, s.rate_rps FROM runs r JOIN load_steps s USING (run_id) "
                           "WHERE r.purpose = 'noise' AND s.kind IN ('capacity', 'confirm') "
                           "ORDER BY r.started_at, r.run_index, s.step_index")
    runs = list(dict.fromkeys(k for k, _ in rows))
    rates = {k: [x for j, x in rows if j == k] for k in runs}
    (cap0,), = r.results.query(f"SELECT coalesce(capacity_interp_rps, capacity_rps) FROM runs WHERE run_id = '{runs[0]}'")
    assert rates[runs[0]][0] == r.profile.capacity.start_rps
    assert [rates[k][0] for k in runs[1:]] == [pytest.approx(cap0)] * 4
    assert era.noise["curve_run_id"] == runs[0]
    span = {k: max(v) / min(v) for k, v in rates.items()}
    assert span[runs[0]] > max(span[k] for k in runs[1:])
    assert sum(len(rates[k]) for k in runs[1:]) / 4 < len(rates[runs[0]])
