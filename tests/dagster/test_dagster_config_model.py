"""An endpoint whose model is its own config.json, through real Dagster runs: the replay pool, the
confirmed baseline and the baseline's noise floor (repeated capacity searches on the emulator built from
that config) materialize, and the measured server's resolved KV pool is the one the config implies."""
import json

import dagster as dg

from autoresearch_dagster.emulator.catalog import GiB, gpu
from jobs.instance import execute
from resources import MeasurementSettings

from ..emulator.test_hf_config import QWEN3_MOE
from .conftest import ROOT, make_defs

LINES = 600  # the first minutes of the demo log: a small pool
SMALL = MeasurementSettings(step_duration_s=6.0, min_completed=20, warmup_s=1.0, start_rps=16.0, max_steps=10,
                            resolution=0.2, noise_runs=5, quick_diagnosis=True, diagnosis_probes=False)


def test_pool_baseline_and_noise_floor_of_a_config_json_model(tmp_path, instance):
    (tmp_path / "models" / "qwen3-30b-a3b").mkdir(parents=True)
    (tmp_path / "models" / "qwen3-30b-a3b" / "config.json").write_text(json.dumps(QWEN3_MOE))
    logs = tmp_path / "logs"
    logs.mkdir()
    head = (ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines(keepends=True)[:LINES]
    (logs / "chat.jsonl").write_text("".join(head))
    (tmp_path / "endpoints").mkdir()  # the config lives outside the spec directory (*.json there are specs)
    (tmp_path / "endpoints" / "ep1.yaml").write_text(
        "name: ep1\nmodel: ../models/qwen3-30b-a3b/config.json\nhardware: {gpu: H200, count: 1}\n"
        "sla: 'ttft_p99<=3000ms,tpot_p99<=60ms,errors<=1%'\nserver_config: {}\n"
        f"workload: {{logs: [{logs / 'chat.jsonl'}], format: auto, mode: capacity}}\nengine: emulator\n")
    (tmp_path / "candidates").mkdir()
    defs = make_defs(tmp_path, SMALL)
    instance.add_dynamic_partitions("endpoints", ["ep1"])
    keys = [dg.AssetKey(k) for k in ("replay_pool", "confirmed_baseline", "noise_baseline")]
    result = execute(defs, instance, "ep1", keys, checks=[])
    assert result.success
    (noise,) = result.asset_materializations_for_node("noise_baseline")
    assert noise.metadata["capacity_rps"].value > 0 and noise.metadata["runs"].value == 5
    era = json.loads(next((tmp_path / "out" / "ep1" / "campaign").rglob("noise.json")).read_text())
    info = era["run_details"][0]["server_info"]
    # Qwen3-30B-A3B from its config: 30.5B bf16 weights; KV 2 x 48 layers x 4 heads x 128 x 2 bytes per token
    params = 48 * (2048 * 4096 * 2 + 2 * 2048 * 512 + 128 * 3 * 2048 * 768) + 2 * 151936 * 2048
    kv_per_token = 2 * 48 * 4 * 128 * 2
    pool = gpu("H200").memory_gib * GiB * info["mem_fraction_static"] - params * 2
    assert info["model_path"] == str(tmp_path / "models" / "qwen3-30b-a3b" / "config.json")
    assert 0 <= pool - info["max_total_num_tokens"] * kv_per_token < kv_per_token
