"""A campaign on a vLLM endpoint, run on the emulator's view of it (what the real-engine campaign does with vLLM's
CPU build, at a test's speed): vLLM knobs proposed from the vLLM recipes, the emulator calibrated on the
endpoint's own factors (engine_options.calibrate_params) and used as the pre-screen, a confirmed gain, and a
review package that launches vLLM. The endpoint's engine runs on hidden factors the surrogate never sees."""
import json

from autoresearch_dagster.campaign.loop import CampaignRunner
from autoresearch_dagster.campaign.state import CampaignSettings
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.memory import Memory
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import VLLM_KNOBS, CampaignBudget, load_endpoint
from tests.emulator.test_cpu_device import TINY_LLAMA

from ..agents.helpers import long_prompt_pool
from .helpers import TINY


def test_a_campaign_on_a_vllm_endpoint_confirms_a_gain_on_vllms_knobs(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY_LLAMA))
    (tmp_path / "ep.yaml").write_text(json.dumps({
        "name": "tiny-vllm", "model": "tiny", "hardware": {"gpu": "cpu"}, "engine": "vllm",
        "sla": "ttft_p99<=2000ms,tpot_p99<=100ms,errors<=1%", "server_config": {"max_num_seqs": 2},
        "engine_options": {"model_path": "tiny", "emulator_device": "CPU-SPR-2C", "kv_cache_gb": 1,
                           "hidden_factors_seed": 5, "calibrate_params": ["step_overhead_s", "per_req_overhead_s"]}}))
    ep = load_endpoint(tmp_path / "ep.yaml")
    settings = CampaignSettings(directions_per_round=4, experiments_per_round=1, search_trials=2, prescreen=True,
                                diagnosis_probes=False,
                                budget=CampaignBudget(max_experiments=1, max_concurrent_gpus=1))
    r = CampaignRunner(ep, long_prompt_pool(tmp_path), engine=EmulatorEngine(ep), out_dir=tmp_path / "campaign",
                       settings=settings, measurement=TINY.with_overrides(start_rps=0.5, max_steps=16),
                       results=open_lake(tmp_path / "lake"), memory=Memory(tmp_path / "memory"))
    report = r.run()
    assert report["gain"] > 1.2 and report["gain_ci"][0] > 1.0
    exp = report["experiments"][0]
    assert exp["verdict"] == "better" and set(exp["intervention"]) <= set(VLLM_KNOBS)
    assert report["best_config"]["max_num_seqs"] > 2
    assert set(r.state.surrogate["calibration"]["params"]) == {"step_overhead_s", "per_req_overhead_s"}
    assert (tmp_path / "campaign" / "rounds" / "001" / "prescreen.json").exists()
    cmd = (tmp_path / "campaign" / "review" / "launch_command.sh").read_text()
    assert f"vllm serve {tmp_path / 'tiny'}" in cmd and "--max-num-seqs" in cmd
