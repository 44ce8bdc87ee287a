"""The Modal runner as far as it runs offline: the Modal app is defined (its GPU function on the endpoint's
GPUs, the image's SGLang release known before any deploy), its function body measures the embedded
emulator locally, and the ``remote_measurement`` asset drives it through Dagster Pipes in a separate
process: its log lines, materialization metadata and ``valid_run`` check arrive in the Dagster run."""
import dagster as dg
import pytest

from assets.remote import choose_where
from autoresearch_dagster.engines.modal_app import (
    build_app, gpu_spec, image_engine_version, measurement_request, run_measurement,
)
from autoresearch_dagster.results import ResultsLake
from autoresearch_dagster.spec import load_endpoint
from jobs.instance import execute
from resources import MeasurementSettings
from .conftest import ROOT, make_defs, write_spec

REMOTE = dg.AssetKey("remote_measurement")
SMALL = MeasurementSettings(step_duration_s=10.0, min_completed=60, warmup_s=2.0, start_rps=8.0, max_steps=12)


@pytest.fixture
def built(tmp_path, instance):
    """Endpoint ep1 over the demo log's first minutes with its pool and baseline materialized."""
    logs, specs = tmp_path / "logs", tmp_path / "endpoints"
    logs.mkdir(), specs.mkdir(), (tmp_path / "candidates").mkdir()
    head = (ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines(keepends=True)[:600]
    (logs / "chat.jsonl").write_text("".join(head))
    write_spec(specs, "ep1", [logs / "chat.jsonl"])
    defs = make_defs(tmp_path, SMALL)
    instance.add_dynamic_partitions("endpoints", ["ep1"])
    assert execute(defs, instance, "ep1", [dg.AssetKey("replay_pool"), dg.AssetKey("confirmed_baseline")]).success
    return tmp_path, defs


def test_the_app_is_defined_offline_with_the_endpoints_gpus_and_a_known_release():
    ep = load_endpoint(ROOT / "examples/endpoints/demo.yaml")
    app, fn = build_app(gpu=gpu_spec(ep), image="lmsysorg/sglang:v0.5.23-cu126")
    assert app.name == "autoresearch-measure" and fn is not None
    assert gpu_spec(ep) == (ep.hardware.gpu if ep.hardware.count == 1 else f"{ep.hardware.gpu}:{ep.hardware.count}")
    assert image_engine_version("lmsysorg/sglang:v0.5.23-cu126") == "0.5.23"
    assert image_engine_version("lmsysorg/sglang:latest") == "unknown"
    assert image_engine_version("registry.local:5000/sglang") == "unknown"  # a port is not a tag


def test_where_follows_the_engine_and_the_credentials():
    assert choose_where("auto", "modal", True) == "modal"
    assert choose_where("auto", "modal", False) == "local"
    assert choose_where("auto", "emulator", True) == "local"
    with pytest.raises(dg.Failure, match="credentials"):
        choose_where("modal", "modal", False)


def test_the_function_body_measures_the_emulator_locally(built):
    project, _ = built
    ep = load_endpoint(project / "endpoints" / "ep1.yaml")
    pool = ResultsLake(project / "out" / "lake").pool_dir("ep1")
    out = run_measurement(measurement_request(ep, ep.server_config, pool, engine="emulator", seed=3))
    assert out["valid"], out["invalid_reasons"]
    assert out["capacity_rps"] > 0 and out["engine"] == "emulator" and out["engine_version"].startswith("emulator-")
    assert len(out["steps"]) >= 3 and out["server_info"]
    assert "sglang:" in out["metrics_text"]  # the /metrics snapshot taken before the deployment closed


def test_remote_measurement_reports_back_through_pipes(built, instance):
    project, defs = built
    result = execute(defs, instance, "ep1", [REMOTE])
    assert result.success
    (mat,) = [e.event_specific_data.materialization for e in result.all_events
              if e.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION and e.asset_key == REMOTE]
    md = mat.metadata
    assert md["where"].value == "local" and md["engine"].value == "emulator" and md["valid"].value is True
    assert md["capacity_rps"].value > 0 and md["image_engine_version"].value == "0.5.23"
    assert len(md["steps"].value) >= 3 and md["metrics_lines"].value > 0
    (check,) = [e.event_specific_data for e in result.all_events
                if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION]
    assert check.check_name == "valid_run" and check.passed
    logs = [e.message for e in instance.all_logs(result.run_id) if e.user_message]
    assert any("measuring ep1" in m for m in logs) and any("capacity" in m and "valid True" in m for m in logs)
