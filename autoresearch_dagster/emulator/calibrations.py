"""Owns the calibration store: each endpoint's fitted efficiency factors, versioned, with what they came from.

A calibration (``emulator.calibrate``) fitted to a measured load curve is kept with the endpoint as
``<lake>/_calibrations/<endpoint>/v<N>.json`` (N = 1, 2, ...; a file is never rewritten, so every
version stays readable) and one row in the results lake's ``calibrations`` table. Each version
records the engine and engine version the curve was measured on, the config and pool it was
measured with, why it was made (``cli``, ``campaign``, ``drift``), the fitted factors, the full
``Efficiency`` they complete, and the fit's error before and after.

The latest version fitted under the running cost model (``cost_model``) is what the proposers' surrogate starts from
(``campaign.loop``; a version of an older cost model is kept and readable, not started from), and what an
``engine: emulator`` endpoint runs on when its spec asks (``engine_options: {calibration: latest}``
or a path to a version file; ``engines.emulator``). Efficiency fields are read by name, so a
version written before a field was added completes it with the field's default.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from autoresearch_dagster.emulator.cost import Efficiency, cost_model_fingerprint
from autoresearch_dagster.outputs.files import atomic_write_text, json_safe
from autoresearch_dagster.spec import SpecError

CALIBRATIONS_DIR = "_calibrations"  # under the lake root: not a table (directories starting with _ are not)
TABLE = "calibrations"
_VERSION = re.compile(r"^v(\d+)\.json$")


@dataclass
class StoredCalibration:
    """One version of an endpoint's calibration."""
    endpoint: str
    engine: str
    engine_version: str
    model: str
    gpu: str
    gpus: int
    config_hash: str
    pool_hash: str
    reason: str  # cli | campaign | drift
    source: str  # what was measured: a directory, a campaign era's noise run
    params: dict[str, float]  # the fitted factors
    efficiency: dict[str, float]  # every factor the emulator runs on (the fitted ones and the starting point's)
    error_before: dict[str, float]  # metric -> mean |relative error| with the starting factors
    error_after: dict[str, float]
    points: int
    n_evals: int
    success: bool
    residuals: list[dict[str, Any]] = field(default_factory=list)  # per point: measured and emulated per metric
    detail: dict[str, Any] = field(default_factory=dict)  # what triggered it (drift statistics), campaign ids
    version: int = 0
    created_at: str = ""
    path: str = ""
    # the cost model the factors were fitted under (cost.cost_model_fingerprint; save fills it in): factors of another
    # cost model mean other things, so a campaign does not start from them ("" = written before it was recorded)
    cost_model: str = ""

    @property
    def current(self) -> bool:
        """Fitted under the cost model the emulator runs now."""
        return self.cost_model == cost_model_fingerprint()

    def to_efficiency(self) -> Efficiency:
        return efficiency_of(self.efficiency)

    def lake_row(self) -> dict[str, Any]:
        mean = lambda d: sum(d.values()) / len(d) if d else None  # noqa: E731
        return {"version": self.version, "engine": self.engine, "engine_version": self.engine_version,
                "model": self.model, "gpu": self.gpu, "config_hash": self.config_hash, "pool_hash": self.pool_hash,
                "reason": self.reason, "source": self.source, "params_json": json.dumps(self.params, sort_keys=True),
                "efficiency_json": json.dumps(self.efficiency, sort_keys=True),
                "error_before": mean(self.error_before), "error_after": mean(self.error_after),
                "points": self.points, "success": self.success, "path": self.path,
                "detail_json": json.dumps(json_safe(self.detail), sort_keys=True), "created_at": self.created_at}


def efficiency_of(values: dict[str, Any]) -> Efficiency:
    """An Efficiency from stored values: known fields by name, the rest at their defaults."""
    known = {f.name for f in fields(Efficiency)}
    return Efficiency().replace(**{k: float(v) for k, v in values.items() if k in known and v is not None})


def calibration_dir(lake_root: str | Path, endpoint: str) -> Path:
    if not endpoint or "/" in endpoint or endpoint.startswith((".", "_")):
        raise SpecError(f"calibration store: invalid endpoint name {endpoint!r}")
    return Path(lake_root) / CALIBRATIONS_DIR / endpoint


def versions(directory: str | Path) -> list[tuple[int, Path]]:
    """(version, path) of the calibration files in ``directory``, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in d.iterdir() if (m := _VERSION.match(p.name))]
    return sorted(out)


def load(path: str | Path) -> StoredCalibration:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise SpecError(f"calibration file {p} does not exist") from None
    except (ValueError, IsADirectoryError) as e:
        raise SpecError(f"calibration file {p} is not a calibration JSON file: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"calibration file {p} does not hold a JSON object")
    missing = [k for k in ("endpoint", "params", "efficiency") if not isinstance(data.get(k), (str, dict))]
    if missing:
        raise SpecError(f"calibration file {p} lacks {', '.join(missing)}")
    known = {f.name for f in fields(StoredCalibration)}
    try:
        return StoredCalibration(**{k: v for k, v in data.items() if k in known})
    except TypeError as e:
        raise SpecError(f"calibration file {p} is incomplete: {e}") from None


def latest(lake_root: str | Path, endpoint: str) -> StoredCalibration | None:
    """The endpoint's newest calibration, or None when it has none."""
    found = versions(calibration_dir(lake_root, endpoint))
    return load(found[-1][1]) if found else None


def _unknown(v: Any) -> bool:
    return v is None or str(v) in ("", "unknown")


def mismatch(cal: StoredCalibration, **now: Any) -> str:
    """Why ``cal`` does not describe the endpoint as it runs ``now`` (engine, engine_version, model, gpu; "" when it
    does): factors fitted under another engine release, model or GPU priced other kernels. The published SGLang/vLLM
    ratio on one page spans 0.06..1.58 across releases (``validation.engine_pairs``). A side that is unknown
    matches anything."""
    off = [f"{k} {getattr(cal, k)} (now {v})" for k, v in now.items()
           if not _unknown(v) and not _unknown(getattr(cal, k, None)) and str(getattr(cal, k)) != str(v)]
    return ("measured on " + ", ".join(off)) if off else ""


def latest_matching(lake_root: str | Path, endpoint: str, **now: Any) -> tuple[StoredCalibration | None, list[str]]:
    """The endpoint's newest calibration fitted under the running cost model (``StoredCalibration.current``) and
    matching ``now`` (``mismatch``), and why each newer version was passed over."""
    passed: list[str] = []
    for version, path in reversed(versions(calibration_dir(lake_root, endpoint))):
        cal = load(path)
        why = "fitted under another cost model" if not cal.current else mismatch(cal, **now)
        if not why:
            return cal, passed
        passed.append(f"v{version}: {why}")
    return None, passed


def resolve(ref: str | Path, *, endpoint: str, lake_root: str | Path | None = None) -> StoredCalibration:
    """What a spec's ``engine_options.calibration`` names: ``latest`` (needs ``lake_root``), a version file,
    or a directory of versions (its newest)."""
    if str(ref) == "latest":
        if lake_root is None:
            raise SpecError("engine_options.calibration: 'latest' needs the results lake (the CLI's --lake)")
        cal = latest(lake_root, endpoint)
        if cal is None:
            raise SpecError(f"engine_options.calibration: endpoint {endpoint!r} has no calibration under "
                            f"{calibration_dir(lake_root, endpoint)} (run `autoresearch emulator calibrate` first)")
        return cal
    p = Path(ref)
    if p.is_dir():
        found = versions(p)
        if not found:
            raise SpecError(f"engine_options.calibration: {p} holds no v<N>.json calibration")
        return load(found[-1][1])
    return load(p)


def save(lake_root: str | Path, cal: StoredCalibration, *, results: Any = None) -> StoredCalibration:
    """Store ``cal`` as the endpoint's next version (never overwriting one: a concurrent writer that took the
    number first pushes this one to the next) and append its lake row when ``results`` is given."""
    from autoresearch_dagster.results import utc_now

    d = calibration_dir(lake_root, cal.endpoint)
    d.mkdir(parents=True, exist_ok=True)
    cal.created_at = cal.created_at or utc_now().isoformat()
    cal.cost_model = cal.cost_model or cost_model_fingerprint()  # fitted just now, on the cost model that runs now
    n = (versions(d)[-1][0] if versions(d) else 0) + 1
    while True:
        target = d / f"v{n}.json"
        cal.version, cal.path = n, str(target)
        staged = atomic_write_text(d / f".v{n}.{os.getpid()}.staged",
                                   json.dumps(json_safe(asdict(cal)), indent=2, sort_keys=True) + "\n")
        try:
            os.link(staged, target)  # fails if the version exists: versions are immutable
            break
        except FileExistsError:
            n += 1
        finally:
            staged.unlink(missing_ok=True)
    if results is not None:
        results.append(TABLE, [cal.lake_row()], endpoint=cal.endpoint)
    return cal


def calibrated_efficiency(endpoint: Any) -> Efficiency | None:
    """The factors an emulator endpoint's spec asks to run on (``engine_options.calibration``: ``latest`` from the
    lake at ``engine_options.calibration_lake``, default ``out/lake``, or a version file or directory), else None."""
    opts = getattr(endpoint, "engine_options", None) or {}
    ref = opts.get("calibration")
    if ref is None:
        return None
    if opts.get("hidden_factors_seed") is not None:
        raise SpecError("engine_options: calibration and hidden_factors_seed both set; an endpoint runs on one set "
                        "of factors, choose one")
    return resolve(ref, endpoint=endpoint.name, lake_root=opts.get("calibration_lake", "out/lake")).to_efficiency()
