"""Owns the Engine protocol: deploy(config) -> a running Deployment that can execute load steps.

Implementations: ``emulator`` (default; in-process virtual time or its real-time HTTP server),
``sglang`` (local server subprocess), ``modal`` (remote GPU), ``external`` (an existing URL,
measure only). The harness, the capacity search and the CLI only talk to this protocol.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from autoresearch_dagster.loadgen.records import ScheduledRequest, StepOutcome


class EngineError(RuntimeError):
    """A deployment could not start, became unhealthy, or drifted from the requested config."""


@runtime_checkable
class Deployment(Protocol):
    base_url: str | None  # HTTP base URL (without /v1) when the deployment serves HTTP

    def run_step(self, schedule: list[ScheduledRequest], *, step_id: str, timeout_s: float) -> StepOutcome:
        """Execute one open-loop schedule and return one record per scheduled request."""

    def flush_cache(self) -> bool:
        """Flush the prefix cache; False when the engine has none."""

    def server_info(self) -> dict[str, Any]:
        """Resolved config and engine version (SGLang's /server_info shape)."""

    def metrics_text(self) -> str:
        """Prometheus exposition text with SGLang metric names ('' when unavailable)."""

    def start_profile(self, output_dir: str) -> None: ...

    def stop_profile(self) -> list[str]:
        """Stop profiling; return the trace files written (Chrome trace JSON, gzipped or not)."""

    def close(self) -> None: ...


class Engine(Protocol):
    name: str
    restartable: bool  # False for 'external': baseline measurement only

    def deploy(self, config: dict[str, Any], *, seed: int = 0) -> Deployment:
        """Start (or attach to) a deployment with this server config, wait healthy, warm up."""

    def version(self) -> str:
        """The engine's reported version string (drives the engine_version source asset)."""
