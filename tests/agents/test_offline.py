"""The offline proposer: recipes, then surrogate-guided search, four-part proposals with modelled predictions."""
from autoresearch_dagster.agents.guardrails import Guardrails, resolved_config
from autoresearch_dagster.agents.offline import OfflineProposer, Predictor
from autoresearch_dagster.agents.proposal import ResearchBrief
from autoresearch_dagster.agents.surrogate import Corrector, Surrogate
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.spec import config_hash

from .helpers import FAST, long_prompt_pool, small_endpoint


def _setup(tmp_path):
    ep = small_endpoint()
    sur = Surrogate(ep, long_prompt_pool(tmp_path), capacity=FAST)
    resolved = resolved_config(EmulatorEngine(ep).deploy({}).server_info())
    return ep, sur, resolved


def _brief(ep, resolved, **kw):
    data = dict(campaign_id="c1", round=1, endpoint=ep.name, model=ep.model, gpu="H100", gpus=1, engine="emulator",
                sla=str(ep.sla), pool_id="p", baseline_config={}, baseline_hash=config_hash({}),
                resolved_baseline=resolved, direction="kernels_quant", question="what relieves decode?",
                hypotheses=[{"bottleneck": "decode_bound_small_batch", "score": 0.4,
                             "evidence": ["TPOT at light load is 70% of its limit"]}], noise={"margin": 0.03})
    data.update(kw)
    return ResearchBrief(**data)


def test_proposals_are_four_part_with_predictions_from_the_model_and_a_trace(tmp_path):
    ep, sur, resolved = _setup(tmp_path)
    s = OfflineProposer(Predictor(sur, Corrector()), Guardrails(gpus=1), search_trials=4).propose(_brief(ep, resolved))
    assert s.error is None and s.proposals
    ratios = {p.prediction.capacity_ratio for p in s.proposals}
    assert len(ratios) == len(s.proposals) and all(r > 1.03 for r in ratios)  # modelled, not a constant
    p = s.proposals[0]
    assert p.direction == "kernels_quant" and p.proposer == "offline" and "TPOT at light load" in p.explanation
    assert p.prediction.ratio_low < p.prediction.capacity_ratio < p.prediction.ratio_high
    assert p.prediction.latency and "surrogate" in p.prediction.basis and p.falsification
    assert s.trace["trials"] and s.trace["recipes"] and s.trace["surrogate_model"] == sur.model_id


def test_a_gate_failure_and_tested_configs_are_learned_not_retried(tmp_path):
    ep, sur, resolved = _setup(tmp_path)
    prop = OfflineProposer(Predictor(sur, Corrector()), Guardrails(gpus=1), search_trials=4)
    first = prop.propose(_brief(ep, resolved))
    fp8 = {"quantization": "fp8"}
    assert any(p.intervention.delta() == fp8 for p in first.proposals)  # proposed before it failed / was tested
    failed = prop.propose(_brief(ep, resolved, gate_failures=[["quantization=fp8"]]))
    assert failed.proposals == [] or all(p.intervention.delta().get("quantization") != "fp8" for p in failed.proposals)
    notes = [t["note"] for t in failed.trace["trials"] if t["value"] is None]
    assert any("failed the correctness gate" in n for n in notes)
    tested = prop.propose(_brief(ep, resolved, tested_configs={config_hash(fp8): "same in e-1"}))
    assert all(p.intervention.delta() != fp8 for p in tested.proposals)


def test_the_offline_proposer_is_deterministic_for_a_seed(tmp_path):
    ep, sur, resolved = _setup(tmp_path)
    prop = OfflineProposer(Predictor(sur, Corrector()), Guardrails(gpus=1), search_trials=4)
    a, b = prop.propose(_brief(ep, resolved)), prop.propose(_brief(ep, resolved))
    assert [p.model_dump() for p in a.proposals] == [p.model_dump() for p in b.proposals]


def test_a_hybrid_models_state_memory_split_is_researched_only_where_it_exists(tmp_path):
    from autoresearch_dagster.agents.search import SearchSpace

    assert "mamba_full_memory_ratio" in SearchSpace.full(1, {}, traits=frozenset({"linear_attention"})).choices
    assert "mamba_full_memory_ratio" not in SearchSpace.full(1, {}).choices  # no effect on other models
    hypotheses = [{"bottleneck": "admission_limit", "score": 0.5, "evidence": ["the batch sits at its cap"]}]
    tried = {}
    for model in ("qwen3.5-9b", "llama-3.1-8b"):
        ep = small_endpoint(model=model)
        sur = Surrogate(ep, long_prompt_pool(tmp_path / model), capacity=FAST)
        resolved = resolved_config(EmulatorEngine(ep).deploy({}).server_info())
        s = OfflineProposer(Predictor(sur, Corrector()), Guardrails(gpus=1), search_trials=2).propose(
            _brief(ep, resolved, model=model, direction="parallel_admission", hypotheses=hypotheses))
        assert s.error is None
        tried[model] = ({r["name"] for r in s.trace["recipes"]},
                        [t["config"].get("mamba_full_memory_ratio") for t in s.trace["trials"]])
    recipes, ratios = tried["qwen3.5-9b"]
    assert "hybrid_state_memory" in recipes and {1.8, 0.45} <= set(ratios)  # double and half of SGLang's 0.9
    recipes, ratios = tried["llama-3.1-8b"]
    assert "hybrid_state_memory" not in recipes and set(ratios) == {None}
