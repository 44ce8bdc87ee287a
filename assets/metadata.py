"""Owns the helpers that turn core results into Dagster metadata (tables, schemas, embedded plots)."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq


def parquet_schema(path: Path) -> dg.TableSchema:
    schema = pq.read_schema(path)
    return dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type)) for f in schema])


def png_markdown(path: Path, title: str) -> str:
    """A PNG embedded as a data URI: Dagster 1.13 has no image metadata type."""
    b64 = base64.b64encode(Path(path).read_bytes()).decode()
    return f"![{title}](data:image/png;base64,{b64})"


def json_safe(value: Any) -> Any:
    """Metadata JSON must be plain JSON: drop NaN/inf and non-JSON types."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
