"""Owns the external side of the ``remote_measurement`` asset: a process Dagster starts through Pipes
(``PipesSubprocessClient``) that runs one measurement, on Modal (``engine: modal`` with credentials) or
locally on the embedded emulator (the offline default), and reports back into the Dagster run: log
lines, the materialization's metadata (capacity, engine version, timings, the load curve's steps) and
the ``valid_run`` check.

Extras from the asset: ``request`` (``engines.modal_app.measurement_request``), ``where`` (``modal`` |
``local``), ``image``, ``app_name``.
"""
from __future__ import annotations

import json

from dagster_pipes import open_dagster_pipes

from autoresearch_dagster.engines.modal_app import image_engine_version, run_measurement, run_remote


def main() -> None:
    with open_dagster_pipes() as pipes:
        request, where = pipes.get_extra("request"), pipes.get_extra("where")
        image = pipes.get_extra("image")
        pipes.log.info(f"measuring {request['endpoint']['name']} config {json.dumps(request['config'], sort_keys=True)} "
                       f"on {'Modal' if where == 'modal' else 'the local ' + request['engine']} "
                       f"(image {image}: SGLang {image_engine_version(image)})")
        result = (run_remote(request, image=image, app_name=pipes.get_extra("app_name")) if where == "modal"
                  else run_measurement(request))
        pipes.log.info(f"run {result['run_id']}: capacity {result['capacity_rps']} req/s, valid {result['valid']}"
                       + (f" ({'; '.join(result['invalid_reasons'])})" if result["invalid_reasons"] else ""))
        steps = [{k: s.get(k) for k in ("rate_rps", "achieved_rps", "meets_sla", "ttft_ms", "tpot_ms", "itl_ms")}
                 for s in result["steps"]]
        pipes.report_asset_materialization(metadata={
            "where": where, "engine": result["engine"], "engine_version": result["engine_version"],
            "image_engine_version": image_engine_version(image),
            "capacity_rps": {"raw_value": result["capacity_rps"], "type": "float"} if result["capacity_rps"] is not None
            else {"raw_value": "none (invalid run)", "type": "text"},
            "valid": result["valid"], "gpu_seconds": result["gpu_seconds"], "run_id": result["run_id"],
            "steps": {"raw_value": steps, "type": "json"}, "timings": {"raw_value": result["timings"], "type": "json"},
            "metrics_lines": len((result.get("metrics_text") or "").splitlines())})
        pipes.report_asset_check("valid_run", passed=bool(result["valid"]),
                                 metadata={"invalid_reasons": {"raw_value": result["invalid_reasons"], "type": "json"}})


if __name__ == "__main__":
    main()
