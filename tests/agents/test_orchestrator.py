"""The orchestrator: directions, parallel sessions, guardrails, controls, selection, traces."""
import json
from pathlib import Path

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


class ProductPredictor:
    """A stand-in model: each knob change multiplies capacity by its own factor (one knob hurts in company)."""

    def __init__(self, factors, clash=()):
        self.factors, self.clash, self.calls = factors, set(clash), 0

    def predict(self, base, configs, **_):
        self.calls += 1
        out = []
        for cfg in configs:
            r = 1.0
            for k in cfg:
                r *= self.factors.get(k, 1.0)
            if self.clash <= set(cfg) and self.clash:
                r *= 0.8
            out.append({"feasible": True, "ratio": r, "raw_ratio": r, "low": r * 0.9, "high": r * 1.1, "basis": "x",
                        "base_capacity": 1.0, "capacity": r, "latency_metric": "tpot", "latency_change": None})
        return out

    def prediction(self, pred, confidence=0.8):
        from autoresearch_dagster.agents.proposal import Prediction
        return Prediction(capacity_ratio=pred["ratio"], ratio_low=pred["low"], ratio_high=pred["high"], basis="a product model")


def test_the_joint_candidate_adds_disjoint_ideas_while_the_model_says_they_add_up():
    from autoresearch_dagster.agents.orchestrator import joint_candidate

    ideas = [(1.30, {"enable_mixed_chunk": True}, "a", "scheduling_cache"),
             (1.20, {"enable_mixed_chunk": True, "schedule_policy": "lpm"}, "b", "scheduling_cache"),  # overlaps a
             (1.15, {"max_running_requests": 256}, "c", "parallel_admission"),
             (1.10, {"page_size": 16}, "d", "scheduling_cache"),  # clashes with a in the model: not added
             (1.08, {"cuda_graph_max_bs_decode": 256}, "e", "kernels_quant")]
    model = ProductPredictor({"enable_mixed_chunk": 1.3, "schedule_policy": 0.92, "max_running_requests": 1.15,
                              "page_size": 1.1, "cuda_graph_max_bs_decode": 1.08}, clash=("enable_mixed_chunk", "page_size"))
    cfg, pred, parents, dirs = joint_candidate(ideas, model, {}, {"max_running_requests": 2048}, 0.04, 4, 1)
    assert cfg == {"enable_mixed_chunk": True, "max_running_requests": 256, "cuda_graph_max_bs_decode": 256}
    assert parents == ["a", "c", "e"] and dirs[0] == "scheduling_cache"
    assert abs(pred["ratio"] - 1.3 * 1.15 * 1.08) < 1e-9
    # at most max_changes knobs; one idea alone is no combination
    cfg2, *_ = joint_candidate(ideas, model, {}, {}, 0.04, 2, 1)
    assert len(cfg2) == 2
    assert joint_candidate(ideas[:1], model, {}, {}, 0.04, 4, 1) is None
    # an addition the model cannot tell from noise (gain below a quarter of the margin) is left out
    flat = ProductPredictor({"enable_mixed_chunk": 1.3, "max_running_requests": 1.005})
    assert joint_candidate(ideas[:3], flat, {}, {}, 0.04, 4, 1) is None


def test_a_round_proposes_the_joint_candidate_first_when_it_beats_every_single(tmp_path):
    fake = FakeProposer({
        "scheduling_cache": [_prop("a", "scheduling_cache", {"enable_mixed_chunk": True}, 1.3)],
        "parallel_admission": [_prop("c", "parallel_admission", {"max_running_requests": 1024}, 1.15)],
        "kernels_quant": [_prop("e", "kernels_quant", {"cuda_graph_max_bs_decode": 256}, 1.08)]})
    fake_traces = {"kernels_quant": {"trials": [{"config": {"cuda_graph_max_bs_decode": 512}, "value": 1.12,
                                                 "source": "tpe"}]}}
    orig = fake.propose

    def propose(brief, tools):
        s = orig(brief, tools)
        s.trace.update(fake_traces.get(brief.direction, {}))
        return s

    fake.propose = propose
    model = ProductPredictor({"enable_mixed_chunk": 1.3, "max_running_requests": 1.15, "cuda_graph_max_bs_decode": 1.1})
    inputs = RoundInputs(brief=_brief(), stats={}, tested={}, gate_failures={})
    plan = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=model, max_experiments=3,
                      n_directions=3, trace_dir=tmp_path)
    first = plan.proposals[0]
    assert first.source == "joint" and first.kind == "combination"
    # the search trial (cuda_graph_max_bs=512, scored 1.12) is an idea too, better than its session's proposal
    assert first.candidate_config == {"enable_mixed_chunk": True, "max_running_requests": 1024,
                                      "cuda_graph_max_bs_decode": 512}
    assert "trace:kernels_quant" in " ".join(first.parent_ids)
    assert [p.id for p in plan.proposals[1:]] == ["a", "c"]  # the singles: its controls
    # the orchestrator's own proposal keeps a trace too: what it was built from, beside the sessions' traces
    trace = json.loads(Path(first.trace).read_text())
    (entry,) = [e for e in trace["proposals"] if e["id"] == first.id]
    assert trace["proposer"] == "orchestrator" and Path(first.trace).parent == tmp_path / "round-002"
    assert entry["parents"] == first.parent_ids and entry["intervention"] == first.intervention.delta()
    assert entry["prediction"]["capacity_ratio"] == first.prediction.capacity_ratio


def test_the_joint_candidate_stakes_one_new_lossy_setting_at_most():
    from autoresearch_dagster.agents.orchestrator import joint_candidate

    ideas = [(1.5, {"quantization": "fp8"}, "q", "kernels_quant"),
             (1.2, {"kv_cache_dtype": "fp8_e4m3"}, "kv", "kernels_quant"),
             (1.1, {"enable_mixed_chunk": True}, "m", "scheduling_cache")]
    model = ProductPredictor({"quantization": 1.5, "kv_cache_dtype": 1.2, "enable_mixed_chunk": 1.1})
    cfg, *_ = joint_candidate(ideas, model, {}, {}, 0.04, 4, 1)
    assert cfg == {"quantization": "fp8", "enable_mixed_chunk": True}  # fp8 KV too: a failed gate would not say which
    # on a baseline that already runs fp8 KV, quantization is the only new stake: both may go together
    kv = {"kv_cache_dtype": "fp8_e4m3"}
    cfg, *_ = joint_candidate([ideas[0], ideas[2]], model, kv, {}, 0.04, 4, 1)
    assert cfg == {**kv, "quantization": "fp8", "enable_mixed_chunk": True}


def test_controls_revert_one_direction_of_a_promotion_at_a_time(tmp_path):
    from autoresearch_dagster.agents.orchestrator import control_groups

    eagle = {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4}
    assert control_groups(eagle) == {"speculative": list(eagle)}  # one technique: its experiment was the control
    both = {**eagle, "enable_mixed_chunk": True, "chunked_prefill_size": 4096}
    assert control_groups(both) == {"speculative": list(eagle),
                                    "scheduling_cache": ["enable_mixed_chunk", "chunked_prefill_size"]}
    prev = {"chunked_prefill_size": 8192}
    base = {**prev, **both}
    model = ProductPredictor({"speculative_algorithm": 1.4, "enable_mixed_chunk": 1.2})
    promo = {"experiment_id": "e-7", "delta": both, "previous_config": prev, "ablated": False}
    inputs = RoundInputs(brief=_brief(baseline_config=base, baseline_hash=config_hash(base)), stats={}, tested={},
                         gate_failures={}, last_promotion=promo)
    plan = plan_round(inputs, [FakeProposer({})], guardrails=Guardrails(gpus=1), predictor=model, max_experiments=3,
                      n_directions=2, trace_dir=tmp_path)
    controls = [p for p in plan.proposals + [] if p.kind == "control"]
    assert len(controls) == 1  # one control per round
    refused = [r["proposal_id"] for r in plan.rejected]
    assert not any("control" in r for r in refused)
    c = controls[0]
    group = c.id.rsplit("control-", 1)[-1]
    assert group in ("speculative", "scheduling_cache")
    reverted = {k for k in both if c.candidate_config.get(k) != base[k]}
    assert reverted == set(control_groups(both)[group])  # the whole group, nothing else


def test_a_measured_gain_is_followed_up_even_when_the_model_predicts_a_loss(tmp_path):
    """The surrogate is wrong in ways only experiments show: a change that measured better on the previous
    baseline is re-applied on the new one although the model says it would now lose."""
    base = {"speculative_algorithm": "EAGLE"}
    model = ProductPredictor({"speculative_algorithm": 1.0, "enable_mixed_chunk": 0.9, "schedule_policy": 1.1},
                             clash=("speculative_algorithm", "enable_mixed_chunk"))
    pool = [{"id": "e-2", "delta": {"enable_mixed_chunk": True}, "technique": "enable_mixed_chunk=True",
             "direction": "scheduling_cache", "ratio": 1.23, "verdict": "better"},
            {"id": "e-3", "delta": {"page_size": 16}, "technique": "page_size=16", "direction": "scheduling_cache",
             "ratio": 1.03, "verdict": "same"}]
    inputs = RoundInputs(brief=_brief(baseline_config=base, baseline_hash=config_hash(base)), stats={}, tested={},
                         gate_failures={}, diversity_pool=pool)
    plan = plan_round(inputs, [FakeProposer({})], guardrails=Guardrails(gpus=1), predictor=model, max_experiments=3,
                      n_directions=2, trace_dir=tmp_path)
    follow = [p for p in plan.proposals if p.kind == "follow_up"]
    assert [p.parent_ids for p in follow] == [["e-2"]]
    assert follow[0].prediction.capacity_ratio < 1  # the model's view is kept as the prediction it is scored on
    assert follow[0].candidate_config == {"speculative_algorithm": "EAGLE", "enable_mixed_chunk": True}
    # the "same" entry is not evidence by itself: the model's prediction decides (here: no gain)
    refused = {tuple(r["parents"]): r for r in plan.rejected if r.get("kind") == "follow_up"}
    assert ("e-3",) in refused and "not evidence-supported" in refused[("e-3",)]["reasons"][0]


def test_a_free_slot_tests_whether_the_two_best_directions_add_up_before_a_variant_of_either(tmp_path):
    fake = FakeProposer({
        "scheduling_cache": [_prop("a", "scheduling_cache", {"enable_mixed_chunk": True}, 1.3),
                             _prop("a2", "scheduling_cache", {"enable_mixed_chunk": True, "schedule_policy": "lpm"},
                                   1.25)],
        "parallel_admission": [_prop("c", "parallel_admission", {"max_running_requests": 1024}, 1.15)]})
    # the model says the two clash (no added gain): no ordinary combination, but the 2x2 design's fourth cell
    model = ProductPredictor({"enable_mixed_chunk": 1.3, "max_running_requests": 1.15, "schedule_policy": 0.96},
                             clash=("enable_mixed_chunk", "max_running_requests"))
    inputs = RoundInputs(brief=_brief(), stats={}, tested={}, gate_failures={})
    plan = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=model, max_experiments=3,
                      n_directions=2, trace_dir=tmp_path)
    assert [p.id for p in plan.proposals[:2]] == ["a", "c"]
    third = plan.proposals[2]
    assert third.source == "factorial" and third.parent_ids == ["a", "c"]
    assert third.candidate_config == {"enable_mixed_chunk": True, "max_running_requests": 1024}
    assert third.prediction.capacity_ratio < 1.3  # predicted honestly: below its best single
    # with two slots the singles come first; a fourth slot goes to the variant
    plan2 = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=model, max_experiments=2,
                       n_directions=2, trace_dir=tmp_path)
    assert [p.id for p in plan2.proposals] == ["a", "c"]
    plan4 = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=model, max_experiments=4,
                       n_directions=2, trace_dir=tmp_path)
    assert [p.id for p in plan4.proposals][3] == "a2"


def test_a_round_stakes_each_new_lossy_setting_once_and_one_at_a_time(tmp_path):
    fake = FakeProposer({
        "kernels_quant": [_prop("both", "kernels_quant", {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}, 2.0),
                          _prop("q", "kernels_quant", {"quantization": "fp8"}, 1.6)],
        "scheduling_cache": [_prop("m", "scheduling_cache", {"enable_mixed_chunk": True}, 1.2),
                             _prop("mq", "scheduling_cache", {"enable_mixed_chunk": True, "quantization": "fp8"},
                                   1.5)]})
    model = ProductPredictor({"quantization": 1.6, "kv_cache_dtype": 1.25, "enable_mixed_chunk": 1.2})
    inputs = RoundInputs(brief=_brief(), stats={}, tested={}, gate_failures={})
    plan = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=model, max_experiments=4,
                      n_directions=4, trace_dir=tmp_path)
    reasons = {r["proposal_id"]: " ".join(r["reasons"]) for r in plan.rejected}
    assert "stakes 2 new lossy settings at once" in reasons["both"]
    staked = [p for p in plan.proposals if "quantization" in p.candidate_config]
    assert len(staked) == 1  # fp8 weights are staked by one experiment of the round: if it fails, only it fails
    assert any(p.id == "m" for p in plan.proposals)


def test_excluded_directions_are_not_opened_and_exhausted_ones_are_no_fallback():
    opened = frozenset({"scheduling_cache", "parallel_admission"})
    rest = [d["direction"] for d in choose_directions(HYP, {}, 2, exclude=opened)]
    assert set(rest) == {"speculative", "kernels_quant"}
    exhausted = {d: DirectionStat(tried=2, streak=2) for d in ("speculative", "kernels_quant")}
    assert choose_directions(HYP, exhausted, 2, exclude=opened) == []
    # without an exclusion, a round whose every direction is exhausted still opens the best of them
    every = {d: DirectionStat(tried=2, streak=2) for d in ("speculative", "kernels_quant", "scheduling_cache",
                                                            "parallel_admission")}
    assert len(choose_directions(HYP, every, 2)) == 2


def test_merged_plans_keep_both_sets_of_sessions_and_take_the_later_proposals(tmp_path):
    from autoresearch_dagster.agents.orchestrator import merge_plans

    fake = FakeProposer({"kernels_quant": [_prop("q", "kernels_quant", {"kv_cache_dtype": "fp8_e4m3"}, 1.3)]})
    inputs = RoundInputs(brief=_brief(), stats={}, tested={}, gate_failures={})
    first = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=None, max_experiments=3,
                       n_directions=2, trace_dir=tmp_path)
    assert first.proposals == [] and [d["direction"] for d in first.directions] == ["scheduling_cache",
                                                                                    "parallel_admission"]
    more = plan_round(inputs, [fake], guardrails=Guardrails(gpus=1), predictor=None, max_experiments=3,
                      n_directions=2, trace_dir=tmp_path,
                      exclude=frozenset(d["direction"] for d in first.directions))
    plan = merge_plans(first, more)
    assert [p.id for p in plan.proposals] == ["q"]
    assert len(plan.directions) == 4 and len(plan.sessions) == 4


def test_the_operators_guardrails_in_the_spec_drop_proposals_with_the_reason():
    from autoresearch_dagster.spec import EndpointSpec

    spec = EndpointSpec(name="demo", model="llama-3.1-8b", hardware={"gpu": "H200", "count": 4}, sla="ttft_p99<=1s",
                        guardrails={"locked_knobs": ["--chunked-prefill-size"], "lossless_only": True, "max_gpus": 2})
    fake = FakeProposer({
        "scheduling_cache": [_prop("locked", "scheduling_cache", {"chunked_prefill_size": 4096}, 1.4),
                             _prop("mixed", "scheduling_cache", {"enable_mixed_chunk": True}, 1.3)],
        "kernels_quant": [_prop("fp8", "kernels_quant", {"quantization": "fp8"}, 1.5)],
        "parallel_admission": [_prop("tp4", "parallel_admission", {"tp_size": 2, "dp_size": 2}, 1.6),
                               _prop("dp2", "parallel_admission", {"dp_size": 2}, 1.2)]})
    inputs = RoundInputs(brief=_brief(gpus=4), stats={}, tested={}, gate_failures={})
    plan = plan_round(inputs, [fake], guardrails=Guardrails.for_endpoint(spec), predictor=None, max_experiments=4,
                      n_directions=3)
    assert sorted(p.id for p in plan.proposals) == ["dp2", "mixed"]
    reasons = {r["proposal_id"]: " ".join(r["reasons"]) for r in plan.rejected}
    assert "chunked_prefill_size is locked by the endpoint's guardrails" in reasons["locked"]
    assert "quantization=fp8: lossy" in reasons["fp8"] and "lossless changes only" in reasons["fp8"]
    assert "tp_size x dp_size = 4 exceeds the deployment's 2 GPU(s)" in reasons["tp4"]
    # without the operator's limits the same proposals pass these checks (the hardware has 4 GPUs)
    free = plan_round(RoundInputs(brief=_brief(gpus=4), stats={}, tested={}, gate_failures={}), [fake],
                      guardrails=Guardrails(gpus=4), predictor=None, max_experiments=5, n_directions=3)
    assert {"locked", "fp8", "tp4"} <= {p.id for p in free.proposals}
