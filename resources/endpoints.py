"""Owns the endpoint registry resource: endpoint specs, their log files and candidate files."""

from pathlib import Path

import dagster as dg

from autoresearch_dagster.spec import EndpointSpec, discover_endpoints, load_server_config


class EndpointRegistry(dg.ConfigurableResource):
    """A directory of endpoint spec files (one endpoint = one dynamic partition)."""

    spec_dir: str = "examples/endpoints"
    candidates_dir: str = "examples/candidates"

    def specs(self) -> list[EndpointSpec]:
        return discover_endpoints(self.spec_dir)

    def names(self) -> list[str]:
        return [s.name for s in self.specs()]

    def load(self, name: str) -> EndpointSpec:
        for spec in self.specs():
            if spec.name == name:
                return spec
        raise KeyError(f"endpoint {name!r} has no spec file in {self.spec_dir}")

    def log_files(self, name: str) -> list[Path]:
        """The endpoint's log files, directories expanded, in a stable order."""
        from autoresearch_dagster.pool.sources import log_files

        return log_files(self.load(name).log_paths())

    def candidates(self, name: str) -> dict[str, dict]:
        """Candidate server configs written by people for this endpoint: ``<name>_*.yaml``."""
        root = Path(self.candidates_dir)
        paths = sorted(root.glob(f"{name}_*.y*ml")) + sorted(root.glob(f"{name}_*.json"))
        return {p.stem: load_server_config(p) for p in paths}
