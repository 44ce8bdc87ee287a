"""Owns the Engine protocol: deploy(config) -> a running Deployment that can execute load steps.

Implementations: ``emulator`` (default; in-process virtual time or its real-time HTTP server),
``sglang`` (local server subprocess), ``modal`` (remote GPU), ``external`` (an existing URL,
measure only). The harness, the capacity search and the CLI only talk to this protocol.
"""
from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

from autoresearch_dagster.loadgen.records import ScheduledRequest, StepOutcome

DRIFT_PREFIX = "config drift"
VALUE_ALIASES = {"bf16": "bfloat16"}  # spellings SGLang resolves to one value (dtype / kv-cache dtype)


class EngineError(RuntimeError):
    """A deployment could not start, became unhealthy, or drifted from the requested config."""


class ConfigDriftError(EngineError):
    """The server resolved a requested knob to another value. Deterministic: a redeploy drifts again."""

    def __init__(self, drift: list[str]):
        super().__init__("; ".join(drift))
        self.drift = list(drift)


def same_value(got: Any, want: Any) -> bool:
    """A resolved knob value equals the requested one: equal, equal as text, an alias, or numerically close."""
    if got == want or str(got) == str(want):
        return True
    if isinstance(want, str) and isinstance(got, str) and VALUE_ALIASES.get(want, want) == VALUE_ALIASES.get(got, got):
        return True
    numeric = (int, float)
    return (isinstance(got, numeric) and isinstance(want, numeric) and not isinstance(got, bool)
            and not isinstance(want, bool) and math.isclose(float(got), float(want), rel_tol=1e-9))


def config_drift(requested: dict[str, Any], server_info: dict[str, Any]) -> list[str]:
    """One ``config drift: ...`` message per knob the config set whose resolved value (``/server_info``,
    flat or under ``server_args``) differs. An engine that reports no config at all (an external
    endpoint) has nothing to verify."""
    resolved = server_info.get("server_args", server_info) if isinstance(server_info, dict) else {}
    if not resolved:
        return []
    out = []
    for name, want in requested.items():
        if want is None:
            continue
        if name not in resolved:
            out.append(f"{DRIFT_PREFIX}: {name} not reported by the server (requested {want!r})")
        elif not same_value(resolved[name], want):
            out.append(f"{DRIFT_PREFIX}: {name} resolved to {resolved[name]!r}, requested {want!r}")
    return out


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
