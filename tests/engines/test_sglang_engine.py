"""The sglang engine's process management, end to end against a fake SGLang launcher (no GPU).

The fake launcher is the tiny torch model's server run as ``python -m autoresearch_dagster.tinymodel``:
it takes SGLang's launch flags, serves /health, /ready, /server_info and OpenAI streaming, and
resolves one knob combination the way SGLang 0.5.23 does (NGRAM turns mixed chunking off).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from autoresearch_dagster.engines.base import ConfigDriftError, EngineError
from autoresearch_dagster.engines.sglang import (SGLangEngine, validate_configs_with_sglang_parser,
                                                 validate_with_sglang_parser)
from autoresearch_dagster.loadgen.records import ScheduledRequest
from autoresearch_dagster.spec import EndpointSpec, SpecError

FAKE = [sys.executable, "-m", "autoresearch_dagster.tinymodel"]


def _endpoint(tmp_path, **opts) -> EndpointSpec:
    options = {"launch_command": FAKE, "model_path": "tiny", "run_dir": str(tmp_path / "runs"),
               "startup_timeout_s": 60, "stop_grace_s": 5}
    options.update(opts)
    return EndpointSpec(name="tiny", model="tiny", hardware={"gpu": "H200", "count": 1},
                        sla="ttft_p99<=3000ms", engine="sglang", engine_options=options)


def _live_members(pgid: int) -> list[int]:
    """Processes in the group that are not zombies (an orphaned child may wait for a slow reaper)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _gone(pgid: int, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while _live_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_launch_command_is_built_from_knobs(tmp_path):
    eng = SGLangEngine(_endpoint(tmp_path, launch_command=None, python="/opt/py/bin/python",
                                 extra_args=["--log-level", "warning"]))
    cmd = eng.launch_command({"chunked_prefill_size": 4096, "enable_mixed_chunk": True, "disable_radix_cache": False,
                              "kv-cache-dtype": "fp8_e4m3", "max_running_requests": None}, port=31000, seed=7)
    assert cmd[:3] == ["/opt/py/bin/python", "-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for part in ["--model-path tiny", "--host 127.0.0.1", "--port 31000", "--enable-metrics", "--enable-cache-report",
                 "--random-seed 7", "--chunked-prefill-size 4096", "--kv-cache-dtype fp8_e4m3", "--log-level warning"]:
        assert part in joined
    assert "--enable-mixed-chunk" in cmd and "--disable-radix-cache" not in cmd
    assert "--max-running-requests" not in cmd  # unset knobs are left to the server
    assert cmd.index("--log-level") > cmd.index("--kv-cache-dtype")  # extra args come last
    with pytest.raises(SpecError, match="schedule_policy"):
        eng.launch_command({"schedule_policy": "priority"}, port=1)


def test_deploy_runs_a_real_server_process_and_close_kills_its_group(tmp_path):
    # like SGLang's scheduler and detokenizer processes, a child shares the server's process group
    with_child = ["sh", "-c", f'sleep 300 & exec "{sys.executable}" -m autoresearch_dagster.tinymodel "$@"', "sh"]
    eng = SGLangEngine(_endpoint(tmp_path, launch_command=with_child))
    dep = eng.deploy({"chunked_prefill_size": 4096, "kv_cache_dtype": "fp8_e4m3"}, seed=3)
    pgid = dep.process.pgid
    try:
        assert dep.process.alive() and len(_live_members(pgid)) >= 2  # server + child
        info = dep.server_info()
        assert info["chunked_prefill_size"] == 4096 and info["random_seed"] == 3
        assert "kv-fp8-e4m3" in info["numerics"]  # the launch flags reached the server and changed its numerics
        assert eng.version() == "tinymodel-1"
        files = {p.name for p in dep.run_dir.iterdir()}
        assert {"launch.json", "server.log", "server_info.json"} <= files
        launch = json.loads((dep.run_dir / "launch.json").read_text())
        assert "--kv-cache-dtype" in launch["argv"] and launch["seed"] == 3
        body = {"prompt": "hello tiny", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
                "temperature": 0}
        sched = [ScheduledRequest(f"r{i}", 0.05 * i, "completions", body, prompt_tokens=10, output_tokens=4)
                 for i in range(3)]
        out = dep.run_step(sched, step_id="s0", timeout_s=30)
        assert [r.status for r in out.records] == ["ok"] * 3
        assert all(r.output_tokens == 4 and r.ttft_s is not None for r in out.records)
    finally:
        dep.close()
    assert _gone(pgid)  # the server and its sleeping child are both gone
    assert (dep.run_dir / "exit_code").exists()
    assert "tinymodel serving" in (dep.run_dir / "server.log").read_text()


def test_drift_refuses_the_deployment_and_stops_the_server(tmp_path):
    eng = SGLangEngine(_endpoint(tmp_path))
    with pytest.raises(ConfigDriftError, match=r"config drift: enable_mixed_chunk resolved to False, requested True"):
        eng.deploy({"speculative_algorithm": "NGRAM", "enable_mixed_chunk": True})
    launch = json.loads(next((tmp_path / "runs").glob("*/launch.json")).read_text())
    assert "--enable-mixed-chunk" in launch["argv"]
    info = json.loads(next((tmp_path / "runs").glob("*/server_info.json")).read_text())
    assert info["enable_mixed_chunk"] is False


def test_server_that_exits_early_reports_its_log(tmp_path):
    crash = [sys.executable, "-c", "import sys; print('CUDA out of memory (pretend)'); sys.exit(3)"]
    eng = SGLangEngine(_endpoint(tmp_path, launch_command=crash))
    with pytest.raises(EngineError, match=r"(?s)exited with code 3.*CUDA out of memory"):
        eng.deploy({})


def test_startup_timeout_kills_a_server_that_ignores_sigterm(tmp_path):
    stubborn = [sys.executable, "-c",
                "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); time.sleep(120)"]
    pidfile = tmp_path / "pid"
    eng = SGLangEngine(_endpoint(tmp_path, launch_command=stubborn, startup_timeout_s=1.5, stop_grace_s=0.5,
                                 env={"PIDFILE": str(pidfile)}))
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="did not become healthy within 1.5 s"):
        eng.deploy({})
    assert time.monotonic() - t0 < 20
    pid = int(pidfile.read_text())
    assert _gone(pid)  # the server was its own group leader: SIGKILL reached it after the grace period


def test_parser_validation_without_sglang_or_with_a_bad_knob(tmp_path):
    assert validate_with_sglang_parser({"schedule_policy": "priority"}, "m")[0].startswith("knob 'schedule_policy'")
    if importlib.util.find_spec("sglang") is None and not os.environ.get("AUTORESEARCH_SGLANG_PYTHON"):
        assert validate_with_sglang_parser({"chunked_prefill_size": 4096}, "m") is None
        assert SGLangEngine(_endpoint(tmp_path)).version() == "unknown"


def _sglang_python() -> str | None:
    if os.environ.get("AUTORESEARCH_SGLANG_PYTHON"):
        return os.environ["AUTORESEARCH_SGLANG_PYTHON"]
    return sys.executable if importlib.util.find_spec("sglang") is not None else None


@pytest.mark.skipif(_sglang_python() is None,
                    reason="sglang is not installed here and AUTORESEARCH_SGLANG_PYTHON is unset "
                           "(scripts/sglang_parser_extra.sh builds a parser venv)")
def test_real_sglang_parser_accepts_valid_and_rejects_invalid_configs():
    py = _sglang_python()
    valid = {"chunked_prefill_size": 4096, "schedule_policy": "lpm", "quantization": "fp8",
             "kv_cache_dtype": "fp8_e4m3", "cuda_graph_max_bs_decode": 128, "speculative_algorithm": "EAGLE"}
    ok, removed, bad_choice, bad_algo, bad_knob = validate_configs_with_sglang_parser(
        [valid, {}, {}, {}, {"tp_size": 3}], "/models/m", python=py,
        extra_args=[[], ["--cuda-graph-max-bs", "128"], ["--schedule-policy", "bogus"],
                    ["--speculative-algorithm", "MTP"], []])
    assert ok == []
    assert removed and "ambiguous option: --cuda-graph-max-bs" in removed[0]
    assert bad_choice and "invalid choice: 'bogus'" in bad_choice[0]
    assert bad_algo and "MTP" in bad_algo[0]
    assert bad_knob and "tp_size" in bad_knob[0]  # caught by KNOBS before SGLang sees it
    assert validate_with_sglang_parser({"page_size": 16}, "/models/m", python=py) == []


def test_correctness_gate_across_two_engine_deployments(tmp_path):
    from autoresearch_dagster.correctness import gate, prompt_set

    eng = SGLangEngine(_endpoint(tmp_path))
    base = eng.deploy({}, seed=0)
    try:
        cand = eng.deploy({"kv_cache_dtype": "fp8_e4m3"}, seed=0)
        try:
            res = gate(base.base_url, cand.base_url, prompt_set(1, long_chars=200), model="tiny", gen_tokens=8)
        finally:
            cand.close()
    finally:
        base.close()
    assert res.passed and res.method == "echo" and 0 < res.kl_mean < res.threshold


# ---------------------------------------------------------------- against the emulator impersonating SGLang

STANDIN = [sys.executable, str(Path(__file__).with_name("sglang_emulator_standin.py"))]
DEMO = Path(__file__).resolve().parents[2] / "examples" / "endpoints" / "demo.yaml"


def _emulated_endpoint(tmp_path) -> EndpointSpec:
    return EndpointSpec(name="emu-sglang", model="gemma-moe-26b-a4b", hardware={"gpu": "H200", "count": 1},
                        sla="ttft_p99<=3000ms", engine="sglang",
                        engine_options={"launch_command": STANDIN, "model_path": "gemma-moe-26b-a4b",
                                        "extra_args": ["--emulate-endpoint", str(DEMO)],
                                        "run_dir": str(tmp_path / "runs"), "startup_timeout_s": 60,
                                        "stop_grace_s": 5})


def _requests(n: int) -> list[ScheduledRequest]:
    body = {"messages": [{"role": "user", "content": "profile me " * 20}], "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}}
    return [ScheduledRequest(f"p{i}", 0.02 * i, "chat", body, prompt_tokens=40, output_tokens=8) for i in range(n)]


def test_the_runner_lifecycle_against_the_emulator_server_profiles_the_window_and_keeps_traces_with_the_run(tmp_path):
    """Free port, launch with the flags, health, /server_info, /metrics, the profile window around a step
    (traces in the run's directory and handed to the diagnosis), logs kept, the process group gone."""
    from autoresearch_dagster.diagnose.profile import parse_profile

    eng = SGLangEngine(_emulated_endpoint(tmp_path))
    dep = eng.deploy({"chunked_prefill_size": 4096}, seed=1)
    pgid = dep.process.pgid
    try:
        assert dep.server_info()["chunked_prefill_size"] == 4096  # the flag reached the emulated server
        assert eng.version().startswith("emulator-")  # what its /server_info reports
        assert "sglang:num_running_reqs" in dep.metrics_text()
        diag = tmp_path / "diagnosis" / "profile"
        dep.start_profile(str(diag))
        with pytest.raises(EngineError, match="profile window is open"):
            dep.start_profile(str(diag))
        out = dep.run_step(_requests(6), step_id="profiled", timeout_s=60)
        assert [r.status for r in out.records] == ["ok"] * 6
        files = dep.stop_profile()
        assert files and all(Path(f).parent == diag and Path(f).name.endswith(".trace.json.gz") for f in files)
        kept = sorted((dep.run_dir / "profiles" / "00").glob("*.trace.json.gz"))
        assert [p.name for p in kept] == sorted(Path(f).name for f in files)  # the run keeps its own copy
        summary = parse_profile(Path(files[0]))
        assert sum(summary.n_steps.values()) > 0  # a readable trace of the window's forward steps
        window = json.loads((dep.run_dir / "profiles.json").read_text())[0]
        assert window["start_status"] == window["stop_status"] == 200 and window["files"]
        assert dep.stop_profile() == []  # no window open: nothing to stop
    finally:
        dep.close()
    assert _gone(pgid)
    assert (dep.run_dir / "exit_code").exists()
    assert "emulated SGLang server" in (dep.run_dir / "server.log").read_text()


def test_a_failed_profile_window_still_tears_the_server_down_and_keeps_its_trace(tmp_path):
    """A step that fails inside the window: close() stops the profiler (its trace stays with the run), then
    the process group; a server that refuses /start_profile is an EngineError naming its answer."""
    eng = SGLangEngine(_emulated_endpoint(tmp_path))
    dep = eng.deploy({}, seed=0)
    pgid = dep.process.pgid
    try:
        dep.start_profile(str(tmp_path / "diag"))
        dep.run_step(_requests(3), step_id="doomed", timeout_s=60)
        raise KeyboardInterrupt  # the diagnosis step dies here, before stop_profile
    except KeyboardInterrupt:
        pass
    finally:
        dep.close()
    assert _gone(pgid)
    window = json.loads((dep.run_dir / "profiles.json").read_text())[0]
    assert window["stop_status"] == 200 and window["files"]
    assert all(Path(f).exists() and Path(f).is_relative_to(dep.run_dir) for f in window["files"])

    dep = eng.deploy({}, seed=0)
    try:
        # another client's window is open on the server: SGLang refuses a second start
        from autoresearch_dagster.engines.base import http_request

        assert http_request(dep.base_url + "/start_profile", method="POST", body=b"{}")[0] == 200
        with pytest.raises(EngineError, match=r"(?s)/start_profile answered HTTP 400.*already in progress.*server log"):
            dep.start_profile(str(tmp_path / "diag2"))
    finally:
        dep.close()
    assert json.loads((dep.run_dir / "profiles.json").read_text())[0]["start_status"] == 400
