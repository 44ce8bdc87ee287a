"""Research on a vLLM endpoint: the surrogate predicts vLLM configs through the emulator's view of the
endpoint (emulator/engine_view.py), and the offline proposer proposes vLLM knob moves from its vLLM
recipes, each with a modelled prediction. Nothing here starts vLLM."""
import json

from autoresearch_dagster.agents.guardrails import Guardrails
from autoresearch_dagster.agents.offline import OfflineProposer, Predictor
from autoresearch_dagster.agents.proposal import ResearchBrief
from autoresearch_dagster.agents.recipes import load_recipes
from autoresearch_dagster.agents.surrogate import Corrector, Surrogate
from autoresearch_dagster.spec import VLLM_KNOBS, config_hash, load_endpoint
from tests.agents.test_engine_tables import VLLM_RESOLVED
from tests.emulator.test_cpu_device import TINY_LLAMA

from .helpers import FAST, long_prompt_pool


def _vllm_endpoint(tmp_path, server_config):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY_LLAMA))
    path = tmp_path / "ep.yaml"
    path.write_text(json.dumps({
        "name": "tiny-vllm", "model": "tiny", "hardware": {"gpu": "cpu"}, "engine": "vllm",
        "sla": "ttft_p99<=2000ms,tpot_p99<=100ms,errors<=1%", "server_config": server_config,
        "engine_options": {"model_path": "tiny", "emulator_device": "CPU-SPR-2C", "kv_cache_gb": 1,
                           "calibrate_params": ["step_overhead_s", "per_req_overhead_s"]}}))
    return load_endpoint(path)


def test_the_surrogate_predicts_vllm_configs_through_the_emulators_view(tmp_path):
    ep = _vllm_endpoint(tmp_path, {"max_num_seqs": 2})
    sur = Surrogate(ep, long_prompt_pool(tmp_path), capacity=FAST)
    assert sur.params == ("step_overhead_s", "per_req_overhead_s")
    two, eight = sur.evaluate([{"max_num_seqs": 2}, {"max_num_seqs": 8}])
    assert two.feasible and eight.feasible and eight.capacity_rps > 1.3 * two.capacity_rps
    assert two.config_hash == config_hash({"max_num_seqs": 2})  # cached under the vLLM config, not its view


def test_vllm_recipes_serve_vllm_endpoints_only():
    by_engine = {}
    for r in load_recipes():
        by_engine.setdefault(r.engine, []).append(r)
        assert all(k in VLLM_KNOBS for m in r.moves for k in m) or r.engine != "vllm"
    assert {"vllm_running_batch_cap", "vllm_step_token_budget", "vllm_prefix_caching"} <= {
        r.name for r in by_engine["vllm"]}


def test_the_offline_proposer_raises_a_binding_vllm_sequence_cap(tmp_path):
    ep = _vllm_endpoint(tmp_path, {"max_num_seqs": 2})
    sur = Surrogate(ep, long_prompt_pool(tmp_path), capacity=FAST)
    resolved = {**VLLM_RESOLVED, "max_num_seqs": 2}
    brief = ResearchBrief(campaign_id="c1", round=1, endpoint=ep.name, model=ep.model, gpu="cpu", gpus=1,
                          engine="vllm", sla=str(ep.sla), pool_id="p", baseline_config={"max_num_seqs": 2},
                          baseline_hash=config_hash({"max_num_seqs": 2}), resolved_baseline=resolved,
                          direction="parallel_admission", question="is the sequence cap binding?",
                          hypotheses=[{"bottleneck": "admission_limit", "score": 0.6,
                                       "evidence": ["the running batch sits at its cap while requests wait"]}],
                          noise={"margin": 0.03})
    s = OfflineProposer(Predictor(sur, Corrector()), Guardrails(gpus=1, engine="vllm"), search_trials=3).propose(brief)
    assert s.error is None and s.proposals
    p = s.proposals[0]
    assert set(p.intervention.delta()) <= set(VLLM_KNOBS) and p.intervention.delta().get("max_num_seqs", 0) > 2
    assert p.prediction.capacity_ratio > 1.2 and "surrogate" in p.prediction.basis
    assert any(r["name"] == "vllm_running_batch_cap" for r in s.trace["recipes"])


def test_the_claude_session_is_told_the_vllm_knobs_of_a_vllm_endpoint():
    from autoresearch_dagster.agents.claude import submit_tool_spec, system_prompt
    from autoresearch_dagster.agents.tools import ToolBox

    prompt = system_prompt(Guardrails(gpus=1, engine="vllm"))
    assert "vLLM serving endpoint" in prompt and "vLLM EngineArgs" in prompt and "- max_num_seqs (int" in prompt
    assert "max_running_requests" not in prompt
    enum = submit_tool_spec("vllm")["input_schema"]["properties"]["proposals"]["items"]["properties"][
        "intervention"]["properties"]["changes"]["items"]["properties"]["knob"]["enum"]
    assert "max_num_seqs" in enum and "max_running_requests" not in enum
    ref = json.loads(ToolBox(engine="vllm").call("get_knob_reference", {}))
    assert {r["knob"] for r in ref} == set(VLLM_KNOBS)
    assert "max_running_requests" in {r["knob"] for r in json.loads(ToolBox().call("get_knob_reference", {}))}


def test_the_diagnosis_reads_vllms_sequence_cap_as_the_running_batch_cap():
    from autoresearch_dagster.diagnose.report import resolved_knobs

    info = {"engine": "vllm", "version": "0.32.0", "server_args": dict(VLLM_RESOLVED, max_num_seqs=8)}
    got = resolved_knobs(info, {"max_num_seqs": 8})
    assert got["max_running_requests"] == 8 and got["max_num_batched_tokens"] == 2048
