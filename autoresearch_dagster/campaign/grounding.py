"""Owns the campaign's link to the calibration store and the emulator error report: calibrate, verify, re-calibrate.

- The surrogate starts from the endpoint's newest stored calibration of the running cost model measured on the
  same engine release, model and GPU (``emulator.calibrations.latest_matching``), else from the efficiency profile
  of the endpoint's engine and release (``emulator.engine_profiles.profile_for``: an SGLang or vLLM endpoint; an
  emulator endpoint has none), and
  each era's own fit (``CampaignRunner._calibrate``) is stored as the next version (reason ``campaign``).
- Every verified experiment gets the calibrated emulator's raw prediction beside its measurement
  (``emulator_prediction``) and one ``emulator_errors`` row (``agents.emulator_errors``).
- When the error drifts (the median |log error| of the last ``recalibrate_window`` experiments of the
  current calibration above ``recalibrate_error``), the surrogate is refitted on the era's baseline
  curve *and* those experiments' candidate curves (from the lake), so the fit sees the configs whose
  differences it mispredicted, and the fit is stored as the next version (reason ``drift``).
"""
from __future__ import annotations

from typing import Any

from autoresearch_dagster.emulator.calibrations import StoredCalibration, latest_matching, save
from autoresearch_dagster.spec import config_hash


def start_from_store(results: Any, endpoint: str, **now: Any) -> tuple[dict[str, float] | None, int | None, list[str]]:
    """(efficiency values, version, versions passed over and why) of the endpoint's newest stored calibration that
    was fitted under the running cost model and on the engine, engine version, model and GPU it runs ``now``
    (``calibrations.latest_matching``); (None, None, ...) when there is none. A version of another cost model priced
    other mechanics (the demo's surrogate, started from a calibration of cost model 6 on cost model 7, predicted fp8
    KV at 0.94x where a fresh start predicted 1.9x and measured 1.84x); one of another engine release priced other
    kernels, and the calibration's prior would hold the new fit near them."""
    if results is None:
        return None, None, []
    cal, passed = latest_matching(results.root, endpoint, **now)
    return (cal.to_efficiency().__dict__, cal.version, passed) if cal else (None, None, passed)


def start_from_profile(engine: str, engine_version: str | None, model: str,
                       gpu: str) -> tuple[dict[str, float] | None, str]:
    """(efficiency values, provenance) of the engine profile for an endpoint's engine, release, model family and GPU
    (``engine_profiles.profile_for``); (None, why) when none applies. The campaign's calibration on the endpoint's
    own baseline refines the factors from there."""
    from autoresearch_dagster.emulator.engine_profiles import arch_family, profile_for
    from autoresearch_dagster.spec import SpecError

    try:
        arch = arch_family(model)
    except (SpecError, OSError):  # a model the catalog cannot read: the release's profile for every family
        arch = ""
    choice = profile_for(engine, engine_version, arch, gpu)
    return (choice.apply().__dict__ if choice.profile else None), choice.provenance


def store(runner: Any, cal: dict[str, Any], *, config: dict[str, Any], reason: str, source: str,
          detail: dict[str, Any] | None = None) -> int | None:
    """Store a surrogate fit (``Surrogate.fit``'s dict) as the endpoint's next calibration version (None: no lake
    or the fit was not kept)."""
    if runner.results is None or not cal.get("fitted"):
        return None
    ep, st = runner.endpoint, runner.state
    noise = st.era.noise or {}
    stored = save(runner.results.root, StoredCalibration(
        endpoint=ep.name, engine=st.engine, engine_version=str(noise.get("engine_version") or "unknown"),
        model=ep.model, gpu=ep.hardware.gpu, gpus=ep.gpus, config_hash=config_hash(config), pool_hash=st.pool_hash,
        reason=reason, source=source, params=cal["params"], efficiency=runner.surrogate().efficiency.__dict__,
        error_before=cal.get("error_before_by_metric") or {}, error_after=cal.get("error_after_by_metric") or {},
        points=int(cal.get("points") or 0), n_evals=int(cal.get("n_evals") or 0), success=bool(cal.get("success")),
        residuals=cal.get("residuals") or [], detail={"campaign_id": st.campaign_id, "era": st.era.index,
                                                       **(detail or {})}), results=runner.results)
    return stored.version


def emulator_prediction(sur: Any, base: dict[str, Any], candidate: dict[str, Any],
                        version: int | None) -> dict[str, Any] | None:
    """The calibrated emulator's raw capacity ratio of ``candidate`` over ``base`` (None if it cannot model one)."""
    b, c = sur.evaluate([base, candidate])
    if not (b.feasible and c.feasible and b.capacity_rps > 0 and c.capacity_rps > 0):
        return None
    return {"ratio": c.capacity_rps / b.capacity_rps, "baseline_rps": b.capacity_rps, "candidate_rps": c.capacity_rps,
            "calibration_version": version, "surrogate_model": sur.model_id}


def candidate_curves(results: Any, experiment_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """experiment id -> the load steps of its median-capacity valid candidate run, from the lake."""
    if results is None or not experiment_ids:
        return {}
    marks = ",".join("?" * len(experiment_ids))
    runs = results.query(f"SELECT experiment_id, run_id, coalesce(capacity_interp_rps, capacity_rps) FROM runs "
                         f"WHERE arm = 'candidate' AND valid AND experiment_id IN ({marks})", list(experiment_ids))
    picked: dict[str, str] = {}
    for eid in experiment_ids:
        mine = sorted((r for r in runs if r[0] == eid and r[2] is not None), key=lambda r: r[2])
        if mine:
            picked[eid] = mine[len(mine) // 2][1]
    if not picked:
        return {}
    con = results.connect()
    try:
        cur = con.execute(f"SELECT * FROM load_steps WHERE run_id IN ({','.join('?' * len(picked))})",
                          list(picked.values()))
        cols = [d[0] for d in cur.description]
        steps = [dict(zip(cols, row)) for row in cur.fetchall()]
    finally:
        con.close()
    return {eid: [s for s in steps if s["run_id"] == rid] for eid, rid in picked.items()}


def drift_points(runner: Any, experiments: list[dict[str, Any]], *, per_curve: int = 2) -> list[Any]:
    """CurvePoints of the era's baseline load curve (its noise floor's ``curve_run``) and of ``experiments``'
    candidate runs, each with its config."""
    from dataclasses import replace

    from autoresearch_dagster.emulator.calibrate import below_knee, curve_points

    era = runner.state.era
    base_run = next((r for r in runner.control_runs() if r.run_id == era.curve_run_id), None)
    base_run = base_run or next(iter(runner.control_runs()), None)
    points = [replace(p, config=dict(era.config))
              for p in curve_points(below_knee(base_run.steps, keep=per_curve))] if base_run else []
    curves = candidate_curves(runner.results, [e["experiment_id"] for e in experiments])
    for e in experiments:
        pts = curve_points(below_knee(curves.get(e["experiment_id"], []), keep=per_curve))
        points += [replace(p, config=dict(e["candidate_config"])) for p in pts]
    return [replace(p, seed=i) for i, p in enumerate(points)]
