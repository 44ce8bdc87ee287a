"""The modal engine offline: launch plan construction and the clear error without credentials (no network)."""
from __future__ import annotations

import pytest

from autoresearch_dagster.engines import make_engine
from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.engines.modal import ModalEngine
from autoresearch_dagster.spec import EndpointSpec, SpecError


def _endpoint(count: int = 1, **opts) -> EndpointSpec:
    return EndpointSpec(name="remote", model="google/gemma-moe", hardware={"gpu": "H200", "count": count},
                        sla="ttft_p99<=3000ms", engine="modal", engine_options=opts)


def test_plan_carries_the_sglang_flags_and_the_endpoint_hardware():
    eng = ModalEngine(_endpoint(2, volumes={"/models": "weights"}, secrets=["hf"], model_path="/models/gemma",
                                extra_args=["--log-level", "warning"]))
    plan = eng.plan({"tp_size": 2, "chunked_prefill_size": 8192, "enable_mixed_chunk": True}, seed=5)
    assert plan.gpu == "H200:2" and plan.port == 30000 and plan.app_name == "autoresearch-sglang"
    assert plan.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    joined = " ".join(plan.argv)
    for part in ["--model-path /models/gemma", "--host 0.0.0.0", "--port 30000", "--random-seed 5", "--tp-size 2",
                 "--chunked-prefill-size 8192", "--enable-mixed-chunk", "--enable-metrics", "--log-level warning"]:
        assert part in joined
    assert plan.volumes == {"/models": "weights"} and plan.secrets == ["hf"]
    assert ModalEngine(_endpoint(1)).plan({}).gpu == "H200"
    with pytest.raises(SpecError, match="tp_size"):
        eng.plan({"tp_size": 3})


def test_deploy_without_credentials_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    eng = make_engine(_endpoint())
    assert isinstance(eng, ModalEngine) and eng.name == "modal" and eng.restartable
    with pytest.raises(EngineError, match="MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"):
        eng.deploy({})
    assert eng.version() == "0.5.23"  # a failed deploy leaves the image's release


def test_the_engine_version_is_known_from_the_image_before_any_deploy():
    assert ModalEngine(_endpoint()).version() == "0.5.23"  # the default image's tag
    assert ModalEngine(_endpoint(image="lmsysorg/sglang:v0.5.9-cu129")).version() == "0.5.9"
    assert ModalEngine(_endpoint(image="lmsysorg/sglang:latest")).version() == "unknown"
