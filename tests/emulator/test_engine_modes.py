"""EmulatorEngine: the HTTP mode serves real streaming responses the runner measures."""
from __future__ import annotations

from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.loadgen.records import ScheduledRequest

from .helpers import endpoint


def test_http_mode_streams_through_the_runner():
    ep = endpoint()
    body = {"model": ep.model, "prompt": "hello world " * 100, "max_tokens": 20, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    dep = EmulatorEngine(ep, mode="http", noise=NoiseSettings.off()).deploy({"stream_interval": 2}, seed=0)
    try:
        assert dep.base_url.startswith("http://127.0.0.1:")
        sched = [ScheduledRequest(f"h{i}", i * 0.05, "completions", dict(body), 200, 20, [], 64) for i in range(3)]
        out = dep.run_step(sched, step_id="h", timeout_s=30)
        assert [r.status for r in out.records] == ["ok"] * 3
        assert all(r.output_tokens == 20 and r.ttft_s > 0 and len(r.itl_s) == 10 for r in out.records)
        info = dep.server_info()
        assert info["version"].startswith("emulator-") and info["stream_interval"] == 2
    finally:
        dep.close()



def test_a_release_in_the_spec_is_the_version_every_mode_reports():
    from autoresearch_dagster.emulator.core import emulator_version

    plain = endpoint()
    ep = plain.model_copy(update={"engine_options": {**plain.engine_options, "release": "r2"}})
    assert EmulatorEngine(plain).version() == emulator_version()
    assert EmulatorEngine(ep).version() == f"{emulator_version()}+r2"
    assert EmulatorEngine(ep).deploy({}, seed=0).server_info()["version"] == f"{emulator_version()}+r2"
    dep = EmulatorEngine(ep, mode="http", noise=NoiseSettings.off()).deploy({}, seed=0)
    try:
        assert dep.server_info()["version"] == f"{emulator_version()}+r2"  # the HTTP server's /server_info
    finally:
        dep.close()
