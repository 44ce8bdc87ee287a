"""Owns the Engine protocol: deploy(config) -> a running Deployment that can execute load steps.

Implementations: ``emulator`` (default; in-process virtual time or its real-time HTTP server),
``sglang`` and ``vllm`` (local server subprocesses), ``modal`` (remote GPU), ``external`` (an existing URL,
measure only). The harness, the capacity search and the CLI only talk to this protocol.
"""
from __future__ import annotations

import json
import math
import subprocess
import urllib.error
import urllib.request
from typing import Any, Protocol, runtime_checkable

from autoresearch_dagster.loadgen.records import ScheduledRequest, StepOutcome
from autoresearch_dagster.spec import knobs_for

DRIFT_PREFIX = "config drift"


def server_seed(seed: int) -> int:
    """The seed a launched server gets: the harness's run seeds are up to 64-bit, and both SGLang and vLLM pass
    theirs to numpy's legacy ``np.random.seed``, which refuses values of 2**32 and above (vLLM 0.32's CPU worker
    then dies at start-up). Folded into 32 bits, deterministically."""
    return int(seed) % 2**32


class EngineError(RuntimeError):
    """A deployment could not start, became unhealthy, or drifted from the requested config."""


class ConfigDriftError(EngineError):
    """The server resolved a requested knob to another value. Deterministic: a redeploy drifts again."""

    def __init__(self, drift: list[str]):
        super().__init__("; ".join(drift))
        self.drift = list(drift)


def same_value(name: str, got: Any, want: Any, engine: str = "sglang") -> bool:
    """A resolved knob value equals the requested one: equal, equal as text, spellings of one value
    (the knob's aliases in the engine's knob table, ``spec.knobs_for``), or numerically close."""
    k = knobs_for(engine).get(name)
    if k is not None:
        got, want = k.canonical(got), k.canonical(want)
    if got == want or str(got) == str(want):
        return True
    numeric = (int, float)
    return (isinstance(got, numeric) and isinstance(want, numeric) and not isinstance(got, bool)
            and not isinstance(want, bool) and math.isclose(float(got), float(want), rel_tol=1e-9))


def config_drift(requested: dict[str, Any], server_info: dict[str, Any], engine: str = "sglang") -> list[str]:
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
        elif not same_value(name, resolved[name], want, engine):
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


def http_request(url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
                 body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """One admin HTTP call (/health, /server_info, /flush_cache, ...): (status, body); status 0 when
    the server does not answer (refused, reset, timed out), so a caller waiting for health keeps polling."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() if e.fp else b""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, b""


def read_server_info(base_url: str, *, timeout: float) -> dict[str, Any]:
    """A freshly started server's ``/server_info`` (its resolved config); EngineError unless it answers 200."""
    status, body = http_request(base_url + "/server_info", timeout=timeout)
    if status != 200:
        raise EngineError(f"{base_url}/server_info answered HTTP {status}")
    return json.loads(body)


def run_engine_parser(exe: str, script: str, argvs: list[list[str]], results: list[list[str] | None], *, engine: str,
                      timeout_s: float, env: dict[str, str] | None = None) -> list[list[str]] | None:
    """Run an engine's own argument parser (``script``, reading the argv lists as JSON on stdin and printing
    ``{"installed": bool, "errors": [[...], ...]}`` last) under that engine's interpreter ``exe``, and merge
    its errors into ``results``, where configs the knob table already rejected hold their error and the
    others hold None (one argv each, in order). None when the engine is not installed there."""
    try:
        proc = subprocess.run([exe, "-c", script], input=json.dumps(argvs), capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"could not run {engine}'s argument parser with {exe}: {e}") from None
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    try:
        out = json.loads(last)
    except ValueError:
        raise EngineError(f"{engine}'s argument parser crashed under {exe}: {proc.stderr.strip()[-500:]}") from None
    if not out.get("installed"):
        return None
    parsed = iter(out["errors"])
    return [r if r is not None else list(next(parsed)) for r in results]
