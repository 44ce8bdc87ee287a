"""Owns the storage resources: the Parquet results lake, the artifact directory, the memory directory."""

import json
from pathlib import Path
from typing import Any

import dagster as dg

from autoresearch_dagster.outputs.files import write_json


class ResultsLakeResource(dg.ConfigurableResource):
    """The Parquet results lake (store of record) and its DuckDB views file."""

    root: str = "out/lake"

    def lake(self) -> Any:
        from autoresearch_dagster.results import ResultsLake

        return ResultsLake(Path(self.root))


class ArtifactStore(dg.ConfigurableResource):
    """Per-endpoint artifact folders: ``<out_dir>/<endpoint>/<asset>/`` (pools, reports, plots, json)."""

    out_dir: str = "out"

    def dir(self, endpoint: str, asset: str) -> Path:
        path = Path(self.out_dir).resolve() / endpoint / asset
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_json(self, endpoint: str, asset: str, name: str, payload: Any) -> Path:
        """``payload`` as strict JSON at ``<out_dir>/<endpoint>/<asset>/<name>``, written atomically."""
        return write_json(self.dir(endpoint, asset) / name, payload, sort_keys=True)

    def read_json(self, endpoint: str, asset: str, name: str) -> Any:
        path = Path(self.out_dir).resolve() / endpoint / asset / name
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: materialize {asset!r} for endpoint {endpoint!r} first")
        return json.loads(path.read_text())


class MemoryStore(dg.ConfigurableResource):
    """The findings memory: text files under ``path``, a git repository of its own (``memory.Memory``)."""

    path: str = "out/memory"

    def dir(self) -> Path:
        p = Path(self.path)
        p.mkdir(parents=True, exist_ok=True)
        return p
