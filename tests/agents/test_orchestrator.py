"""The orchestrator: directions, parallel sessions, guardrails, controls, selection, traces."""
import json

from autoresearch_dagster.agents.guardrails import Guardrails
from autoresearch_dagster.agents.orchestrator import DirectionStat, RoundInputs, choose_directions, plan_round
from autoresearch_dagster.agents.proposal import Proposal, ResearchBrief, Session
from autoresearch_dagster.spec import config_hash

HYP = [{"bottleneck": "prefill_interference", "direction": "scheduling_cache", "score": 0.5, "evidence": ["e1"]},
       {"bottleneck": "kv_capacity", "direction": "parallel_admission", "score": 0.2, "evidence": ["e2"]}]


def _brief(**kw):
    data = dict(campaign_id="c", round=2, endpoint="demo", model="m", gpu="H200", gpus=1, engine="emulator",
                sla="ttft_p99<=1s", pool_id="p", baseline_config={}, baseline_hash=config_hash({}),
                resolved_baseline={"chunked_prefill_size": 8192, "max_running_requests": 2048},
                direction="scheduling_cache", question="", hypotheses=HYP, noise={"margin": 0.04})
    data.update(kw)
    return ResearchBrief(**data)


def _prop(pid, direction, changes, ratio, justification=""):
    return Proposal(id=pid, endpoint="demo", proposer="fake", source="test", direction=direction,
                    explanation="because of the evidence", falsification="refuted if not better",
                    intervention={"changes": [{"knob": k, "value": v} for k, v in changes.items()],
                                  "justification": justification},
                    prediction={"capacity_ratio": ratio, "ratio_low": ratio * 0.9, "ratio_high": ratio * 1.1,
                                "basis": "a model"})


class FakeProposer:
    name = "fake"

    def __init__(self, by_direction, fail_on=()):
        self.by_direction, self.fail_on, self.briefs = by_direction, fail_on, []

    def propose(self, brief, tools):
        self.briefs.append(brief)
        if brief.direction in self.fail_on:
            raise RuntimeError("model overloaded")
        return Session(proposer=self.name, direction=brief.direction, proposals=self.by_direction.get(brief.direction, []),
                       trace={"read": brief.question})


def test_directions_follow_the_diagnosis_and_switch_when_one_keeps_giving_same():
    dirs = choose_directions(HYP, {}, 2)
    assert [d["direction"] for d in dirs] == ["scheduling_cache", "parallel_admission"]
    assert "prefill_interference" in dirs[0]["question"]
    stats = {"scheduling_cache": DirectionStat(tried=2, streak=2)}
    assert [d["direction"] for d in choose_directions(HYP, stats, 2)][0] == "parallel_admission"
    # a direction never tried gets a small exploration bonus over an unscored tried one
    tried = {d: DirectionStat(tried=1, streak=1) for d in ("speculative",)}
    assert choose_directions([], tried, 4)[-1]["direction"] == "speculative"


def test_a_round_runs_sessions_checks_guardrails_and_keeps_their_traces(tmp_path):
    fake = FakeProposer({
        "scheduling_cache": [_prop("a", "scheduling_cache", {"enable_mixed_chunk": True}, 1.4),
                             _prop("dup", "scheduling_cache", {"enable_mixed_chunk": True}, 1.3),
                             _prop("tiny", "scheduling_cache", {"schedule_policy": "lpm"}, 1.005)],
        "parallel_admission": [_prop("big", "parallel_admission", {"max_running_requests": 128}, 1.2)]},
        fail_on=("kernels_quant",))
    inputs = RoundInputs(brief=_brief(), stats={}, tested={config_hash({"page_size": 16}): "same in e-0"},
                         gate_failures={})
    plan = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=None, max_experiments=3,
                      n_directions=3, trace_dir=tmp_path)
    assert [p.id for p in plan.proposals] == ["a"]
    reasons = {r["proposal_id"]: " ".join(r["reasons"]) for r in plan.rejected}
    assert "same candidate config" in reasons["dup"] and "not evidence-supported" in reasons["tiny"]
    assert "x16 step" in reasons["big"]
    failed = [s for s in plan.sessions if s["error"]]
    assert failed and "model overloaded" in failed[0]["error"]  # one failed session does not stop the round
    trace = json.loads(open(plan.proposals[0].trace).read())
    assert trace["trace"]["read"] and plan.proposals[0].candidate_config == {"enable_mixed_chunk": True}
    assert {b.direction for b in fake.briefs} == {"scheduling_cache", "parallel_admission", "kernels_quant"}


def test_tested_configs_and_failed_gate_settings_are_refused_with_the_reason(tmp_path):
    fake = FakeProposer({"scheduling_cache": [_prop("t", "scheduling_cache", {"page_size": 16}, 1.2)],
                         "kernels_quant": [_prop("q", "kernels_quant", {"quantization": "fp8"}, 1.5)]})
    inputs = RoundInputs(brief=_brief(), stats={}, tested={config_hash({"page_size": 16}): "same in e-0"},
                         gate_failures={"e-9": ["quantization=fp8"]})
    plan = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=None, max_experiments=3,
                      n_directions=3)
    reasons = {r["proposal_id"]: " ".join(r["reasons"]) for r in plan.rejected}
    assert "already tested: same in e-0" in reasons["t"] and "failed the correctness gate in e-9" in reasons["q"]
    assert plan.proposals == []
