"""Owns the file outputs: the one atomic write every file goes through, the one JSON cleaner, and the
runner's files (per-request records in Parquet, the load curve in Parquet + CSV, replay intervals in CSV).
"""
from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from autoresearch_dagster.loadgen.records import StepOutcome, records_to_table

FILE_MODE = 0o644  # outputs are readable by the group and others, not the 0600 of a mkstemp file


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Write ``path`` all or nothing: ``write`` creates a hidden temp file beside it (same filesystem, so the
    rename is atomic and readers see the old file or the new one, never a part), which is fsynced, given
    ``FILE_MODE`` and renamed over ``path``. The temp name ends in ``.tmp``, so globs for the target's suffix
    (the lake's ``*.parquet``) never pick it up; a failed write removes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def json_safe(value: Any) -> Any:
    """``value`` as plain, strict JSON: NaN and ±inf become null, numpy scalars Python numbers, tuples lists,
    keys strings, and anything else (paths, datetimes) its ``str``."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def write_json(path: str | Path, payload: Any, *, sort_keys: bool = False) -> Path:
    """``payload`` as strict, indented JSON (cleaned by ``json_safe``), written atomically."""
    text = json.dumps(json_safe(payload), indent=2, sort_keys=sort_keys, allow_nan=False)
    return atomic_write_text(path, text + "\n")


def write_records(outcomes: list[StepOutcome], path: Path) -> Path:
    """All steps' per-request records in one Parquet file (RECORD_SCHEMA; ``scheduled_s`` is the intended offset)."""
    tables = [records_to_table(o.records) for o in outcomes]
    table = pa.concat_tables(tables) if tables else records_to_table([])
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def _flat(step: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for k, v in step.items():
        if isinstance(v, dict):
            for q, x in v.items():
                row[f"{k.removesuffix('_ms')}_{q}_ms"] = x
        elif isinstance(v, list):
            row[k] = "; ".join(map(str, v))
        else:
            row[k] = v
    return row


def load_curve_table(steps: list[dict[str, Any]]) -> pa.Table:
    rows = [_flat(s) for s in steps]
    return pa.Table.from_pylist(rows) if rows else pa.table({})


def write_load_curve(steps: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    table = load_curve_table(steps)
    out_dir = Path(out_dir)
    p = atomic_write(out_dir / "load_curve.parquet", lambda tmp: pq.write_table(table, tmp))
    c = atomic_write(out_dir / "load_curve.csv", lambda tmp: pacsv.write_csv(table, tmp))
    return p, c


def write_intervals(intervals: list[dict[str, Any]], out_dir: Path) -> Path:
    """Per-interval SLA attainment of a production-shape replay (CSV)."""
    table = pa.Table.from_pylist(intervals) if intervals else pa.table({})
    return atomic_write(Path(out_dir) / "intervals.csv", lambda tmp: pacsv.write_csv(table, tmp))
