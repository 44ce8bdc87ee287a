"""External engine (measure-only, refuses other configs); the autoscaling report is tested in tests/measure."""
import pytest

from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.engines.external import ExternalEngine
from autoresearch_dagster.loadgen.http_runner import HttpDeployment
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
