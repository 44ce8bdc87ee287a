"""Owns the emulator_error_report asset: how far the calibrated emulator was off, per endpoint, by knob family.

Thin: reads the endpoint's ``emulator_errors`` rows (one per verified experiment, written by the campaign's
round close) and its ``calibrations`` rows from the results lake, and shows the core's report
(``agents.emulator_errors``) as metadata. Not eager: materialize it from the UI (or with the loop's
other assets) whenever the question is asked; ``promotion_decision`` carries the running median error
every round, so the UI's metadata plot follows it over time without this asset.
"""
from typing import Any

import dagster as dg

from assets.partitions import endpoints
from autoresearch_dagster.outputs.files import json_safe
from resources import ResultsLakeResource

LOOP = "loop"


@dg.asset(partitions_def=endpoints, group_name=LOOP, kinds={"markdown"}, deps=[dg.AssetKey("promotion_decision")])
def emulator_error_report(context: dg.AssetExecutionContext, lake: ResultsLakeResource) -> dg.MaterializeResult:
    """The emulator error report of the endpoint: for every verified experiment, the capacity ratio the calibrated
    emulator predicted beside the measured one; by knob family (median |log error|, bias, worst), over time (a
    rolling median), whether the error drifts (which makes the campaign re-calibrate), and the calibration
    versions stored for the endpoint."""
    from autoresearch_dagster.agents.emulator_errors import error_report, to_markdown

    name = context.partition_key
    results = lake.lake()
    rows = results.read("emulator_errors", endpoint=name)
    cals = results.read("calibrations", endpoint=name)
    versions = sorted(({"version": c["version"], "reason": c["reason"], "engine_version": c["engine_version"],
                        "error_before": c["error_before"], "error_after": c["error_after"],
                        "created_at": c["created_at"]} for c in cals), key=lambda c: c["version"] or 0)
    md: dict[str, Any] = {"experiments": len(rows), "calibrations": len(versions),
                          "latest_calibration": int(versions[-1]["version"]) if versions else 0,
                          "calibration_versions": dg.MetadataValue.json(json_safe(versions))}
    if not rows:
        md["report"] = dg.MetadataValue.md("no verified experiment has an emulator prediction yet")
        return dg.MaterializeResult(metadata=md)
    rep = error_report(rows)
    md.update({"median_abs_log_error": float(rep["median_abs_error"]), "drifting": bool(rep["drift"]["drifting"]),
               "by_family": dg.MetadataValue.json(json_safe(rep["families"])),
               "report": dg.MetadataValue.md(to_markdown(rep))})
    return dg.MaterializeResult(metadata=md)
