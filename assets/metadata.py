"""Owns the helpers that turn core results into Dagster metadata (table schemas, embedded plots); the JSON
cleaning is the core's ``outputs.files.json_safe``."""
from __future__ import annotations

import base64
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq


def parquet_schema(path: Path) -> dg.TableSchema:
    schema = pq.read_schema(path)
    return dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type)) for f in schema])


def png_markdown(path: Path, title: str) -> str:
    """A PNG embedded as a data URI: Dagster 1.13 has no image metadata type."""
    b64 = base64.b64encode(Path(path).read_bytes()).decode()
    return f"![{title}](data:image/png;base64,{b64})"

