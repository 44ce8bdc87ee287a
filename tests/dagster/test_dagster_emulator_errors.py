"""The emulator_error_report asset shows the lake's emulator errors by knob family, the drift flag and calibrations."""
import dagster as dg

from assets.emulator import emulator_error_report
from autoresearch_dagster.agents.emulator_errors import error_row
from autoresearch_dagster.definitions import defs
from autoresearch_dagster.results import open_lake, utc_now
from resources import ResultsLakeResource


def test_the_report_is_in_the_definitions_and_materializes_from_the_lake(tmp_path):
    assert defs.resolve_asset_graph().get(dg.AssetKey("emulator_error_report")).partitions_def.name == "endpoints"
    lake = open_lake(tmp_path / "lake")
    lake.append("emulator_errors", [error_row(
        experiment_id=f"e{i}", proposal_id=f"p{i}", campaign_id="c", round_no=1, era=0, knobs=[knob],
        emulated_ratio=1.2, measured_ratio=1.0, verdict="same", ci=(0.97, 1.03), calibration_version=1,
        surrogate_model="m", baseline_rps=5.0, candidate_rps=6.0, recorded_at=utc_now())
        for i, knob in enumerate(["enable_mixed_chunk", "speculative_algorithm", "chunked_prefill_size"])],
        endpoint="small")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("endpoints", ["small"])
    res = dg.materialize([emulator_error_report], partition_key="small", instance=instance,
                         resources={"lake": ResultsLakeResource(root=str(tmp_path / "lake"))},
                         selection=[emulator_error_report])
    md = res.asset_materializations_for_node("emulator_error_report")[0].metadata
    assert md["experiments"].value == 3 and md["drifting"].value is True  # ~18% off, three times
    fams = {f["family"] for f in md["by_family"].value}
    assert fams == {"scheduling_cache", "speculative"}
    assert "| speculative | 1 |" in md["report"].value
