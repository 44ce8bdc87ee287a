"""The emulator's view of a vLLM endpoint (emulator/engine_view.py): vLLM's knobs become the emulator's
inputs, the served model directory's config.json its card and a catalog device its hardware, so the
campaign's surrogate, calibration and pre-screen work for a vLLM endpoint; SGLang-flavoured endpoints
pass through unchanged. Nothing here starts vLLM."""
import json

import pytest

from autoresearch_dagster.emulator.engine_view import emulator_view
from autoresearch_dagster.engines.emulator import VirtualDeployment
from autoresearch_dagster.spec import SpecError, load_endpoint
from tests.emulator.test_cpu_device import TINY_LLAMA


def vllm_spec(tmp_path, **options):
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    opts = {"model_path": "models/tiny", "kv_cache_gb": 1, "emulator_device": "CPU-SPR-2C", **options}
    path = tmp_path / "ep.yaml"
    path.write_text(json.dumps({"name": "tiny", "model": "tiny", "hardware": {"gpu": "cpu"},
                                "sla": "ttft_p99<=2000ms,tpot_p99<=100ms", "engine": "vllm",
                                "server_config": {"enable_prefix_caching": True}, "engine_options": opts}))
    return load_endpoint(path)


def test_vllm_knobs_map_onto_the_emulators(tmp_path):
    spec = vllm_spec(tmp_path)
    v = emulator_view(spec, {"max_num_seqs": 4, "max_num_batched_tokens": 512, "enable_prefix_caching": False,
                             "max_model_len": 16384, "block_size": 16, "kv_cache_dtype": "fp8"})
    assert v.endpoint.engine == "emulator" and v.endpoint.hardware.gpu == "CPU-SPR-2C" and v.endpoint.sla == spec.sla
    assert v.endpoint.model == str((tmp_path / "models" / "tiny" / "config.json").resolve())
    c = v.config
    assert c["max_running_requests"] == 4 and c["chunked_prefill_size"] == 512 and c["page_size"] == 16
    assert c["disable_radix_cache"] is True and c["disable_cuda_graph"] is True and c["enable_mixed_chunk"] is True
    assert c["disable_overlap_schedule"] is True
    assert c["kv_cache_dtype"] == "fp8_e4m3"
    assert 0.05 <= c["mem_fraction_static"] < 0.1  # 1 GiB of KV plus a few MB of weights on a 23 GiB device
    assert v.not_modelled == ["max_model_len"]


def test_unset_knobs_take_vllms_cpu_defaults_and_chunking_can_be_turned_off(tmp_path):
    spec = vllm_spec(tmp_path)
    c = emulator_view(spec, {}).config
    assert c["max_running_requests"] == 128 and c["chunked_prefill_size"] == 2048 and "disable_radix_cache" not in c
    assert emulator_view(spec, {"enable_chunked_prefill": False}).config["chunked_prefill_size"] == -1


def test_sglang_flavoured_endpoints_pass_through(tmp_path):
    spec = load_endpoint("examples/endpoints/demo.yaml")
    v = emulator_view(spec, {"max_running_requests": 64})
    assert v.endpoint is spec and v.config == {"max_running_requests": 64} and v.not_modelled == []


def test_what_cannot_be_emulated_is_a_clear_error(tmp_path):
    spec = vllm_spec(tmp_path, emulator_device="")
    with pytest.raises(SpecError, match="no catalog device 'cpu'.*emulator_device"):
        emulator_view(spec, {})
    spec = vllm_spec(tmp_path / "b", model_path="elsewhere")
    with pytest.raises(SpecError, match="config.json"):
        emulator_view(spec, {})


def test_a_virtual_deployment_runs_a_vllm_endpoint_as_its_view(tmp_path):
    from autoresearch_dagster.loadgen.records import ScheduledRequest

    spec = vllm_spec(tmp_path)
    slow = VirtualDeployment(spec, {"max_num_seqs": 1})
    fast = VirtualDeployment(spec, {"max_num_seqs": 8})
    assert slow.config["max_running_requests"] == 1 and slow.endpoint.engine == "emulator"
    sched = [ScheduledRequest(request_id=f"r{i}", send_offset_s=0.0, api="chat", body={}, prompt_tokens=200,
                               output_tokens=50)
             for i in range(8)]
    e2e = {}
    for name, dep in (("slow", slow), ("fast", fast)):
        out = dep.run_step(sched, step_id="s", timeout_s=600)
        assert all(r.status == "ok" for r in out.records)
        e2e[name] = max(r.e2e_s for r in out.records)
    assert e2e["slow"] > 3 * e2e["fast"]  # one running request at a time queues the other seven
