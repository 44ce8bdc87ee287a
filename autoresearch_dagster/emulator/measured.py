"""Owns reading a measured baseline load curve from disk, the input of `autoresearch emulator calibrate`.

Two layouts are accepted, both written by the product's own commands (no format of its own):

- ``autoresearch replay capacity --out DIR``: ``DIR/summary.json`` with the search's ``steps`` (arrival
  rate, latency percentiles, SLA outcome, validity), its ``settings`` (the request timeout the steps
  ran with), the replay pool's path and hash, the engine and (since this change) the engine version
  and the server config the endpoint ran;
- ``autoresearch noise --out DIR``: ``DIR/noise.json``; its run that saw the most of the load curve
  (``capacity.curve_run``: the cold first run; the others start at its capacity) is the curve, the run the
  campaign calibrates on, with that run's config and engine version.

A ``load_curve.parquet`` alone (the lake's flat ``load_steps`` rows) is read too when no JSON is there;
its config, pool and engine version then come from the command line. Anything else is a one-line error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoresearch_dagster.emulator.calibrate import infer_arrivals
from autoresearch_dagster.measure.profiles import REQUEST_TIMEOUT_S
from autoresearch_dagster.spec import SpecError


@dataclass
class MeasuredCurve:
    """A measured load curve and what it was measured with (None where the files do not say)."""
    steps: list[dict[str, Any]]
    source: str  # the file read
    kind: str  # capacity | noise | load_curve
    config: dict[str, Any] | None = None
    pool_path: str | None = None
    pool_hash: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    request_timeout_s: float = REQUEST_TIMEOUT_S
    notes: list[str] = field(default_factory=list)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise SpecError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path} does not hold a JSON object")
    return data


def _from_capacity(path: Path) -> MeasuredCurve:
    d = _json(path)
    steps = d.get("steps")
    if not isinstance(steps, list):
        raise SpecError(f"{path} has no 'steps' list (is it the summary.json of `autoresearch replay capacity`?)")
    settings = d.get("settings") or {}
    steps = infer_arrivals(steps, burstiness=float(settings.get("burstiness") or 1.0))
    return MeasuredCurve(steps=steps, source=str(path), kind="capacity", config=d.get("server_config"),
                         pool_path=d.get("pool"), pool_hash=d.get("pool_hash"), engine=d.get("engine"),
                         engine_version=d.get("engine_version"),
                         request_timeout_s=float(settings.get("request_timeout_s") or REQUEST_TIMEOUT_S))


def _from_noise(path: Path) -> MeasuredCurve:
    d = _json(path)
    runs = [r for r in d.get("run_details") or [] if r.get("valid") and r.get("steps")]
    if not runs:
        raise SpecError(f"{path} holds no valid run with load steps")
    from autoresearch_dagster.measure.capacity import curve_run

    median = d.get("median")
    run = curve_run(runs, float(median) if median is not None else None)
    return MeasuredCurve(steps=infer_arrivals(run["steps"]), source=str(path), kind="noise", config=run.get("config"),
                         engine=d.get("engine") or run.get("engine"),
                         engine_version=d.get("engine_version") or run.get("engine_version"),
                         notes=[f"the load curve of run {run.get('run_id')} (the widest of {len(runs)} valid runs)"])


def _from_parquet(path: Path) -> MeasuredCurve:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 -- any unreadable file is the user's input error
        raise SpecError(f"{path} is not a readable Parquet load curve: {e}") from None
    return MeasuredCurve(steps=rows, source=str(path), kind="load_curve")


def read_measured(directory: str | Path) -> MeasuredCurve:
    """The measured curve in ``directory`` (see the module docstring for the layouts)."""
    d = Path(directory)
    if not d.exists():
        raise SpecError(f"--measured {d} does not exist")
    if not d.is_dir():
        raise SpecError(f"--measured {d} is not a directory (give the --out directory of `replay capacity` or `noise`)")
    for name, reader in (("summary.json", _from_capacity), ("noise.json", _from_noise),
                         ("load_curve.parquet", _from_parquet)):
        if (d / name).is_file():
            curve = reader(d / name)
            if not curve.steps:
                raise SpecError(f"{d / name} has no load steps")
            return curve
    raise SpecError(f"--measured {d} holds no summary.json (replay capacity), noise.json (noise) or "
                    "load_curve.parquet")
