"""A model defined by its own config.json, measured through the CLI (`autoresearch replay capacity` on the
emulator), and a bad config.json as a one-line user error (exit 2)."""
import json

import pytest

from autoresearch_dagster.cli import main
from autoresearch_dagster.emulator.catalog import gpu
from autoresearch_dagster.pool.schema import PoolRequest, write_pool

from .test_hf_config import LLAMA_FT


@pytest.fixture
def project(tmp_path):
    """models/ft/config.json (a Llama-3.2-1B-shaped fine-tune), an endpoint spec pointing at it relative to
    its own directory, and a small replay pool."""
    (tmp_path / "models" / "ft").mkdir(parents=True)
    (tmp_path / "models" / "ft" / "config.json").write_text(json.dumps(LLAMA_FT))
    (tmp_path / "endpoints").mkdir()
    (tmp_path / "endpoints" / "ft.yaml").write_text(
        "name: ft\nmodel: ../models/ft/config.json\nhardware: {gpu: L40S, count: 1}\n"
        "sla: 'ttft_p99<=1000ms,tpot_p99<=20ms,errors<=1%'\nengine: emulator\n")
    rows = [PoolRequest(id=f"q{i}", arrival_s=i * 0.1, conversation_id=None, turn=None, api="chat",
                        messages=[{"role": "user", "content": f"question {i}"}], prompt=None, tools=None,
                        tool_choice=None, response_format=None, sampling={"temperature": 0.0},
                        prompt_tokens=600 + (i * 37) % 900, output_tokens=60 + (i * 13) % 200, block_hashes=[],
                        block_tokens=64, split="serving") for i in range(400)]
    write_pool(rows, tmp_path / "pool")
    return tmp_path


def capacity(project, out, spec="ft.yaml"):
    return main(["replay", "capacity", "--pool", str(project / "pool"), "--engine", "emulator",
                 "--endpoint", str(project / "endpoints" / spec), "--out", str(out), "--step-duration", "10",
                 "--min-completed", "30", "--start-rps", "4", "--resolution", "0.2", "--warmup", "1",
                 "--max-steps", "10"])


def test_replay_capacity_of_a_config_json_model(project, tmp_path):
    out = tmp_path / "cap"
    assert capacity(project, out) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["valid"] and s["capacity_rps"] > 4 and s["model"] == str(project / "models" / "ft" / "config.json")
    # at low load a decode step reads every weight once: the fine-tune's 1.24B bf16 parameters (worked out
    # from its config) over the L40S's HBM bandwidth bound the inter-token gap from below; the catalog's
    # 8B Llama would take over 6x as long
    params = 16 * (2048 * 32 * 64 * 2 + 2 * 2048 * 8 * 64 + 3 * 2048 * 8192) + 128256 * 2048
    floor_ms = params * 2 / gpu("L40S").hbm_bw * 1e3
    low = s["steps"][1]
    assert low["rate_rps"] == 4 and floor_ms < low["itl_ms"]["p50"] < 2.5 * floor_ms


@pytest.mark.parametrize("write, message", [
    (None, "model config {cfg} does not exist"),
    ("{\"model_type\": \"llama\",", "model config {cfg} is not valid JSON"),
    (json.dumps({**LLAMA_FT, "model_type": "rwkv", "architectures": ["RwkvForCausalLM"]}),
     "model_type 'rwkv' (RwkvForCausalLM) is not supported; supported model types:"),
    (json.dumps({k: v for k, v in LLAMA_FT.items() if k != "vocab_size"}), "missing field 'vocab_size'"),
])
def test_a_bad_config_json_is_a_one_line_user_error(project, tmp_path, capsys, write, message):
    cfg = project / "models" / "ft" / "config.json"
    if write is None:
        cfg.unlink()
    else:
        cfg.write_text(write)
    assert capacity(project, tmp_path / "cap") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.format(cfg=cfg) in err
