"""The HTTP server over the real EngineCore: SDK round trips, admin views of the real engine, profiles, DP replicas, the CLI."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest
import requests

from autoresearch_dagster.cli import main
from autoresearch_dagster.diagnose.profile import parse_profile
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.server import EmulatorServer, serve_in_thread
from autoresearch_dagster.tokens import count_tokens, synth_text

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def demo_server(demo_endpoint):
    with serve_in_thread(EmulatorServer(demo_endpoint, {"chunked_prefill_size": 4096}, seed=3)) as rs:
        yield rs


def test_sdk_round_trips_and_admin_views_of_the_real_engine(demo_server, tmp_path):
    base = demo_server.base_url
    c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=30)
    system = {"role": "system", "content": synth_text(2000, 7)}
    r1 = c.chat.completions.create(model="gemma-moe-26b-a4b", messages=[system, {"role": "user", "content": "a?"}],
                                   max_tokens=24, extra_body={"ignore_eos": True})
    assert r1.usage.completion_tokens == 24 == count_tokens(r1.choices[0].message.content)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    stream = c.chat.completions.create(model="gemma-moe-26b-a4b", messages=[system, {"role": "user", "content": "b?"}],
                                       max_tokens=16, stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = [ch for ch in stream]
    usage = chunks[-1].usage
    assert usage.completion_tokens == 16 and usage.prompt_tokens_details.cached_tokens >= 1900  # shared system prompt
    comp = c.completions.create(model="gemma-moe-26b-a4b", prompt="The quick brown fox", max_tokens=8)
    assert 1 <= comp.usage.completion_tokens <= 8

    info = requests.get(base + "/server_info", timeout=5).json()
    assert info["chunked_prefill_size"] == 4096  # the config served, resolved like SGLang
    assert info["max_total_num_tokens"] > 100_000 and info["internal_states"][0]["memory_usage"]["weight"] > 10
    assert info["version"].startswith("emulator-")
    text = requests.get(base + "/metrics", timeout=5).text
    assert 'sglang:num_requests_total{model_name="gemma-moe-26b-a4b",engine_type="unified",tp_rank="0"' in text
    assert "# TYPE sglang:token_usage gauge" in text and "# TYPE sglang:time_to_first_token_seconds histogram" in text

    assert requests.post(base + "/start_profile", json={"output_dir": str(tmp_path), "profile_id": "demo"},
                         timeout=5).status_code == 200
    c.chat.completions.create(model="gemma-moe-26b-a4b", messages=[{"role": "user", "content": synth_text(3000, 9)}],
                              max_tokens=20, extra_body={"ignore_eos": True})
    assert requests.post(base + "/stop_profile", timeout=30).status_code == 200
    summary = parse_profile(tmp_path / "demo-TP-0.trace.json.gz")  # the diagnosis parser reads it like SGLang's
    assert summary.has_gpu and summary.n_steps.get("decode", 0) >= 15 and summary.n_steps.get("prefill", 0) >= 1


def test_data_parallel_replicas_serve_concurrently(demo_endpoint):
    """dp_size 2: two long prefills arriving together run on both replicas at once, not one after the other."""
    def ttfts(dp: int) -> list[float]:
        srv = EmulatorServer(demo_endpoint.model_copy(update={"hardware": demo_endpoint.hardware.model_copy(
            update={"count": dp})}), {"dp_size": dp}, noise=NoiseSettings.off())
        with serve_in_thread(srv) as rs:
            c = openai.OpenAI(base_url=rs.base_url + "/v1", api_key="none", max_retries=0, timeout=30)
            c.models.list()
            out: list[float] = []

            def one(i: int) -> None:
                t0 = time.perf_counter()
                for ch in c.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": synth_text(6000, 50 + i)}], max_tokens=2,
                        stream=True, extra_body={"ignore_eos": True}):
                    if ch.choices and ch.choices[0].delta.content:
                        out.append(time.perf_counter() - t0)
                        break

            threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return sorted(out)

    one_replica, two_replicas = ttfts(1), ttfts(2)
    # one replica prefills both prompts (one batch or two steps); two replicas each prefill one, in parallel
    assert two_replicas[1] < 0.8 * one_replica[1]


def test_cli_serve_prints_url_serves_and_stops_on_sigterm(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch_dagster", "emulator", "serve", "--endpoint",
                             "examples/endpoints/demo.yaml", "--port", "0", "--seed", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read()
        assert requests.get(url + "/health", timeout=10).status_code == 200
        r = requests.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "ignore_eos": True},
                          timeout=10)
        assert r.json()["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_cli_serve_rejects_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"chunked_prefill_size": "big"}))
    rc = main(["emulator", "serve", "--endpoint", "examples/endpoints/demo.yaml", "--config", str(bad), "--port", "0"])
    assert rc == 2 and "chunked_prefill_size" in capsys.readouterr().err
    rc = main(["emulator", "serve", "--endpoint", "examples/endpoints/demo.yaml", "--config", str(tmp_path / "no.yaml"),
               "--port", "0"])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
