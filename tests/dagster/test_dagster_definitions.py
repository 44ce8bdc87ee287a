"""The one Definitions object loads, has the loop's shape, and its sensors run by default; the core's CLI
reaches the Dagster layer's `autoresearch run` only through its entry point."""
import subprocess
import sys
import tomllib

import dagster as dg
import yaml

from assets.partitions import EAGER
from autoresearch_dagster.definitions import defs
from .conftest import ROOT

LOOP = ["confirmed_baseline", "noise_baseline", "diagnostic_report", "proposals", "experiment_results",
        "promotion_decision"]


def test_definitions_load_without_cycles():
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert set(LOOP) | {"replay_pool", "engine_version"} <= keys
    for name in LOOP + ["replay_pool"]:
        assert graph.get(dg.AssetKey(name)).partitions_def.name == "endpoints"


def test_baseline_is_a_root_and_everything_below_is_eager_and_gated():
    graph = defs.resolve_asset_graph()
    baseline = graph.get(dg.AssetKey("confirmed_baseline"))
    assert not baseline.parent_keys and baseline.automation_condition is None
    for name in LOOP[1:]:
        assert graph.get(dg.AssetKey(name)).automation_condition == EAGER, name


def test_blocking_checks_exist():
    graph = defs.resolve_asset_graph()
    checks = {(k.asset_key.to_user_string(), k.name): graph.get(k).blocking for k in graph.asset_check_keys}
    assert checks[("replay_pool", "replay_fidelity")] is True
    assert checks[("noise_baseline", "replay_vs_production")] is True
    assert checks[("experiment_results", "correctness_gate")] is True


def test_experiments_fan_out_one_step_each_on_the_gpu_pool():
    node = defs.resolve_assets_def("experiment_results").node_def
    ops = {n.name: n.definition for n in node.nodes}
    assert ops["run_experiment_step"].pool == "gpu"
    assert ops["round_experiments"].output_defs[0].is_dynamic


def test_sensors_run_by_default_and_automation_covers_the_source_asset():
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {"endpoint_discovery_sensor", "engine_version_sensor", "promotion_sensor", "campaign_sensor",
                            "new_logs_sensor", "loop_automation", "orphaned_run_sensor"}
    for s in sensors.values():
        assert s.default_status == dg.DefaultSensorStatus.RUNNING, s.name
    auto = sensors["loop_automation"]
    assert isinstance(auto, dg.AutomationConditionSensorDefinition)
    target = auto.asset_selection.resolve(defs.resolve_asset_graph())
    assert dg.AssetKey("engine_version") in target and dg.AssetKey("noise_baseline") in target


def test_workspace_yaml_is_the_only_loader_config():
    ws = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    assert ws["load_from"][0]["python_module"]["module_name"] == "autoresearch_dagster.definitions"
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {})
    assert "dagster" not in tool and "dg" not in tool


def test_run_command_is_registered_and_reports_user_errors(tmp_path, capsys, monkeypatch):
    from autoresearch_dagster.cli import main

    assert main(["run", "--endpoint", str(tmp_path / "missing.yaml"), "--dagster-home", str(tmp_path)]) == 2
    assert "missing.yaml does not exist" in capsys.readouterr().err
    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USERNAME", "DAGSTER_PG_DB"):
        monkeypatch.delenv(var, raising=False)
    spec = ROOT / "examples/endpoints/demo.yaml"
    assert main(["run", "--endpoint", str(spec), "--storage", "postgres", "--dagster-home", str(tmp_path),
                 "--out", str(tmp_path / "out")]) == 2
    assert "Postgres instance storage needs DAGSTER_PG_HOST" in capsys.readouterr().err


def test_the_core_reaches_the_main_job_only_through_the_commands_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["autoresearch.commands"] == {"run": "jobs.main_job:register",
                                                                "serve": "jobs.serve:register"}
    probe = ("import sys; import autoresearch_dagster.cli as cli; "
             "layer = {'dagster', 'jobs', 'resources', 'assets', 'sensors'}; "
             "print(sorted(layer & set(sys.modules))); cli.build_parser(); print('jobs.main_job' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]
