"""The 'vllm' engine: command, cores, resolved config and drift, a server crash as evidence (against a
stand-in server, always), and the real vLLM CPU build serving the tiny Llama (when `make real-engine` built it)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from autoresearch_dagster.engines import make_engine
from autoresearch_dagster.engines.base import ConfigDriftError, EngineError, config_drift
from autoresearch_dagster.engines.vllm import (
    RESOLVED_PATHS, VllmEngine, _crash_excerpt, parse_cpus, resolved_config, vllm_python,
)
from autoresearch_dagster.loadgen.failures import CONTEXT_TOO_LONG, ENGINE_CRASH, UNSUPPORTED_FEATURE
from autoresearch_dagster.loadgen.http_runner import RunnerSettings
from autoresearch_dagster.loadgen.records import ScheduledRequest
from autoresearch_dagster.spec import EndpointSpec, SpecError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / ".real-engine" / "tiny-llama"
STANDIN = [sys.executable, str(Path(__file__).with_name("vllm_standin.py"))]


def _spec(tmp_path, config=None, **opts) -> EndpointSpec:
    return EndpointSpec.model_validate({
        "name": "tiny", "model": "tiny-llama", "hardware": {"gpu": "cpu"}, "sla": "ttft_p99<=2s", "engine": "vllm",
        "server_config": config or {}, "engine_options": {"run_dir": str(tmp_path / "runs"), "client_cores": "",
                                                          "engine_cores": "", **opts}})


def _req(i: int, content: str = "hello", max_tokens: int = 3, **extra) -> ScheduledRequest:
    return ScheduledRequest(request_id=f"r{i}", send_offset_s=0.05 * i, api="chat",
                            body={"model": "tiny", "messages": [{"role": "user", "content": content}],
                                  "max_tokens": max_tokens, "stream": True, **extra},
                            prompt_tokens=5, output_tokens=max_tokens)


def test_launch_command_cores_and_env(tmp_path):
    eng = make_engine(_spec(tmp_path, {"max_num_seqs": 16, "enable_chunked_prefill": False},
                            python="/opt/v/bin/python", engine_cores="1", client_cores="0",
                            extra_args=["--dtype", "bfloat16"], kv_cache_gb=2))
    assert isinstance(eng, VllmEngine) and eng.engine_cpus == {1} and eng.client_cpus == {0}
    argv = eng.launch_command(eng.endpoint.server_config, port=8123, seed=3)
    assert argv[:7] == ["taskset", "-c", "1", "/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                        "--model"]
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--seed") + 1] == "3"
    assert argv[argv.index("--served-model-name") + 1] == "tiny-llama"
    tail = argv[argv.index("--served-model-name") + 2:]
    assert tail == ["--max-num-seqs", "16", "--no-enable-chunked-prefill", "--dtype", "bfloat16"]
    env = eng.server_env()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_cpu_lists(tmp_path):
    assert parse_cpus("0,2-4") == {0, 2, 3, 4} and parse_cpus("") == set()
    with pytest.raises(SpecError, match="not like"):
        parse_cpus("one")
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(SpecError, match=f"engine_cores: CPUs {missing} are not available"):
        make_engine(_spec(tmp_path, engine_cores=str(missing)))


def test_resolved_config_and_drift():
    dump = {"scheduler_config": {"max_num_seqs": 128, "policy": "fcfs", "max_num_batched_tokens": 2048},
            "cache_config": {"block_size": 128, "cache_dtype": "fp8_e4m3", "enable_prefix_caching": True},
            "model_config": {"dtype": "torch.bfloat16", "max_model_len": 16384}}
    got = resolved_config(dump)
    assert got["scheduling_policy"] == "fcfs" and got["dtype"] == "bfloat16" and got["block_size"] == 128
    assert "tensor_parallel_size" not in got and set(got) <= set(RESOLVED_PATHS)
    info = {"server_args": got}
    assert config_drift({"kv_cache_dtype": "fp8", "max_num_seqs": 128}, info, "vllm") == []  # fp8 is e4m3 in vLLM
    assert config_drift({"block_size": 16}, info, "vllm") == ["config drift: block_size resolved to 128, requested 16"]
    assert config_drift({"enforce_eager": True}, info, "vllm") == [
        "config drift: enforce_eager not reported by the server (requested True)"]


def test_crash_excerpt_finds_the_root_cause():
    log = ("(APIServer pid=1) WARNING [system_utils.py:255] can cause fd limit errors like `OSError: [Errno 24] Too many`\n"
           "(Worker pid=4) ERROR [multiproc_executor.py:1063] Traceback (most recent call last):\n"
           "(Worker pid=4) ERROR [multiproc_executor.py:1063]     gen.set_offset(gen.get_offset() - 4)\n"
           "(Worker pid=4) ERROR [multiproc_executor.py:1063] RuntimeError: CPU Generator does not use offset\n"
           "(APIServer pid=1) ERROR [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered "
           "an issue. See stack trace (above) for the root cause.\n")
    excerpt = _crash_excerpt(log).splitlines()
    assert excerpt[-1].endswith("] RuntimeError: CPU Generator does not use offset")
    assert "gen.set_offset" in excerpt[-2] and not any("OSError" in ln for ln in excerpt[1:])
    assert _crash_excerpt("a\nb\n") == "a\nb"


def test_deploy_drift_and_crash_against_a_standin(tmp_path):
    settings = RunnerSettings(scrape_metrics_s=None, max_send_lag_p99_s=1.0)
    eng = make_engine(_spec(tmp_path, {"max_num_seqs": 16}, launch_command=STANDIN, startup_timeout_s=60),
                      settings=settings)
    with pytest.raises(ConfigDriftError, match="max_num_seqs resolved to 8, requested 16"):
        eng.deploy({"max_num_seqs": 16})
    eng = make_engine(_spec(tmp_path, launch_command=STANDIN + ["--crash-after", "3"], startup_timeout_s=60),
                      settings=settings)
    dep = eng.deploy({"max_num_seqs": 8}, seed=1)
    try:
        assert eng.version() == "0.32.0-standin" and dep.server_info()["server_args"] == {"max_num_seqs": 8}
        out = dep.run_step([_req(i) for i in range(6)], step_id="s", timeout_s=10)
        assert [r.status for r in out.records[:3]] == ["ok"] * 3
        assert {r.error_class for r in out.records[3:]} == {ENGINE_CRASH}
        crash = out.meta["engine_crash"]
        assert crash["failed_requests"] == 3 and crash["exit_code"] == 1
        assert crash["excerpt"].endswith("RuntimeError: CPU Generator does not use offset")
        assert out.meta["failures"][ENGINE_CRASH]["count"] == 3
        with pytest.raises(EngineError, match="(?s)the vLLM server died .*CPU Generator does not use offset"):
            dep.run_step([_req(0)], step_id="s2", timeout_s=5)
    finally:
        dep.close()
    run_dir = dep.run_dir
    assert (run_dir / "launch.json").exists() and (run_dir / "exit_code").read_text().strip() == "1"
    assert "CPU Generator does not use offset" in (run_dir / "server.log").read_text()


def test_adapt_pool_strips_every_steps_requests(tmp_path):
    settings = RunnerSettings(scrape_metrics_s=None, max_send_lag_p99_s=1.0)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    step = [_req(0), _req(1, tools=tools, tool_choice="auto", seed=3)]
    for adapt, classes, counts in [(None, [None, UNSUPPORTED_FEATURE], None),
                                   ({"strip_tools": True, "strip_sampling": ["seed"]}, [None, None],
                                    {"tools_stripped": 1, "sampling_stripped": 1})]:
        opts = {"launch_command": STANDIN, "startup_timeout_s": 60, **({"adapt_pool": adapt} if adapt else {})}
        dep = make_engine(_spec(tmp_path, **opts), settings=settings).deploy({})
        try:
            out = dep.run_step(step, step_id="s", timeout_s=10)
        finally:
            dep.close()
        assert [r.error_class for r in out.records] == classes
        assert out.meta.get("request_adaptation") == counts
    assert "tools" in step[1].body and step[1].body["seed"] == 3  # the caller's schedule is left as it was


# ---------------------------------------------------------------- the real engine

needs_real_engine = pytest.mark.skipif(
    vllm_python() is None or not (TINY / "config.json").exists(),
    reason="needs the real engine: run `make real-engine` (builds .venv-vllm and .real-engine/tiny-llama)")


@pytest.mark.real_engine
@needs_real_engine
def test_real_vllm_serves_refuses_and_reports_its_config(tmp_path):
    """One real vLLM CPU server (about 2 minutes to start on one core): resolved config, the step's
    refusals classified from vLLM's own bodies, the prefix cache reset, the CPU backend's crash on a
    seeded request whose prefill is chunked (vLLM 0.32; pool.adapt strips seeds for it), teardown."""
    spec = _spec(tmp_path, {"max_num_seqs": 4, "max_model_len": 512, "max_num_batched_tokens": 256,
                            "enable_prefix_caching": True},
                 model_path=str(TINY), served_model_name="tiny", engine_cores="1" if os.cpu_count() > 1 else "",
                 client_cores="0" if os.cpu_count() > 1 else "", extra_args=["--dtype", "bfloat16"],
                 startup_timeout_s=900)
    eng = make_engine(spec, settings=RunnerSettings(scrape_metrics_s=None, max_send_lag_p99_s=1.0))
    dep = eng.deploy(dict(spec.server_config))
    try:
        args = dep.server_info()["server_args"]
        assert args["max_num_seqs"] == 4 and args["max_model_len"] == 512 and args["enable_prefix_caching"] is True
        assert args["max_num_batched_tokens"] == 256 and args["enable_chunked_prefill"] is True
        assert eng.version().startswith("0.32")
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
        out = dep.run_step([_req(0), _req(1, "word " * 2000), _req(2, tools=tools, tool_choice="auto"), _req(3)],
                           step_id="real", timeout_s=120)
        assert [r.error_class for r in out.records] == [None, CONTEXT_TOO_LONG, UNSUPPORTED_FEATURE, None]
        assert "maximum context length is 512" in out.meta["failures"][CONTEXT_TOO_LONG]["message"]
        assert dep.flush_cache() is True
        crash = dep.run_step([_req(0, "the " * 350, seed=1)], step_id="seeded", timeout_s=60)  # ~358 tokens > 256
        assert crash.records[0].error_class == ENGINE_CRASH
        assert crash.meta["engine_crash"]["excerpt"].endswith("RuntimeError: CPU Generator does not use offset")
        pgid = dep.process.pgid
    finally:
        dep.close()
    assert _group_gone(pgid, within_s=15), "processes of the server's group outlived close()"


def _group_gone(pgid: int, *, within_s: float) -> bool:
    """The process group is empty (killed children may linger as zombies until init reaps them)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.real_engine
@needs_real_engine
def test_the_correctness_gate_runs_on_real_vllm_logprobs(tmp_path):
    """The harness's gate for a lossy vLLM change (fp8 KV cache) on two real vLLM CPU servers: teacher-forced
    logprobs through /v1/completions, an A/A calibration, a KL with its interval, both servers torn down."""
    from autoresearch_dagster.correctness import prompt_set
    from autoresearch_dagster.experiments.experiment import correctness_check

    spec = _spec(tmp_path, {"max_model_len": 2048}, model_path=str(TINY), served_model_name="tiny",
                 engine_cores="1" if os.cpu_count() > 1 else "", client_cores="", extra_args=["--dtype", "bfloat16"],
                 startup_timeout_s=900)
    eng = make_engine(spec, settings=RunnerSettings(scrape_metrics_s=None))
    res = correctness_check(spec, {"max_model_len": 2048}, {"max_model_len": 2048, "kv_cache_dtype": "fp8"}, None,
                            engine=eng, options={"prompts": prompt_set(2), "gen_tokens": 8})
    assert "error" not in res, res.get("error")
    assert res["method"] in ("echo", "prefix") and res["n_positions"] > 0 and res["calibration"]
    assert res["kl_mean"] >= 0 and res["kl_ci"][0] <= res["kl_mean"] <= res["kl_ci"][1]
    assert isinstance(res["passed"], bool)
