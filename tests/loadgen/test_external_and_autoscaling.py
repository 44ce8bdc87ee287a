"""External engine (measure-only, refuses other configs) and the autoscaling report of shape replays."""
import pytest

from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.engines.external import ExternalEngine
from autoresearch_dagster.loadgen.http_runner import HttpDeployment
from autoresearch_dagster.measure.shape import autoscaling_report
from autoresearch_dagster.spec import EndpointSpec

from .helpers import FaultServer


@pytest.fixture(scope="module")
def server():
    srv = FaultServer()
    url = srv.start()
    yield url
    srv.stop()


def _spec(url, config=None):
    return EndpointSpec.model_validate({"name": "ext", "model": "m", "hardware": {"gpu": "H200", "count": 1},
                                        "sla": "ttft_p99<=1s", "engine": "external", "url": url,
                                        "server_config": config or {}})


def test_external_engine_measures_only_its_own_config(server):
    eng = ExternalEngine(_spec(server + "/v1", {"chunked_prefill_size": 4096}))
    assert eng.name == "external" and eng.restartable is False
    dep = eng.deploy({"chunked_prefill_size": 4096})
    assert isinstance(dep, HttpDeployment) and dep.base_url == server
    with pytest.raises(EngineError, match="not restartable"):
        eng.deploy({"chunked_prefill_size": 8192})
    assert eng.version() == "unknown"  # this server has no /server_info


def test_external_engine_unreachable_is_an_engine_error():
    with pytest.raises(EngineError, match="not answering"):
        ExternalEngine(_spec("http://127.0.0.1:9")).deploy({})


def test_autoscaling_report_from_replicas_timeseries():
    intervals = [{"interval": k, "start_s": k * 10.0, "target_rps": r} for k, r in enumerate([1.0, 1.0, 4.0, 4.0, 1.0])]
    ts = [{"t_s": float(t), "replicas": 1 if t < 26 else 2} for t in range(0, 51, 2)]
    rep = autoscaling_report(ts, intervals, replay_interval_s=10.0, gpus_per_replica=8)
    assert rep["bursts"] == [{"interval": 2, "start_s": 20.0, "follow_s": 6.0}]
    assert rep["median_follow_s"] == 6.0 and rep["bursts_not_followed"] == 0
    assert rep["gpu_seconds"] == pytest.approx((26 * 1 + 24 * 2) * 8)
    virtual = [{"t": r["t_s"], "replicas": r["replicas"]} for r in ts]  # the emulator's time key
    assert autoscaling_report(virtual, intervals, replay_interval_s=10.0, gpus_per_replica=8) == rep
    assert autoscaling_report([{"t_s": 0.0, "num_running": 3}], intervals, replay_interval_s=10.0,
                              gpus_per_replica=1) is None
