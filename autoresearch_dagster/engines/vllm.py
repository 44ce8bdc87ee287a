"""Owns the 'vllm' engine: a local vLLM OpenAI server launched as a subprocess with the config as its flags.

``deploy(config, seed)`` validates the config (vLLM's knob table, then vLLM's own argument parser and
config builder run in the vLLM interpreter: ``make_arg_parser`` + ``validate_parsed_serve_args`` +
``AsyncEngineArgs.from_cli_args(...).create_engine_config()``, which also catches cross-knob errors
such as a token budget below max-model-len), launches ``python -m vllm.entrypoints.openai.api_server
--model ... --host 127.0.0.1 --port <free> --seed <seed>`` plus ``launch_flags(config, "vllm")`` in its
own process group, keeps the command and the server log in a run directory, waits for ``/health``,
reads ``/version`` and the resolved config (``/server_info?config_format=json``, served because the
server runs with ``VLLM_SERVER_DEV_MODE=1`` on loopback only; that also gives ``/reset_prefix_cache``,
the cache flush between steps) and refuses a server whose resolved config differs from what was
asked (config drift names the knob). ``close()`` stops the process group. ``engine_options.adapt_pool``'s stripping
rules (``pool.adapt``: tools, sampling parameters such as ``seed``) apply to every step's requests,
counted in ``meta["request_adaptation"]``, so noise runs, experiments and campaigns replay what this
server can serve; prompts over max-model-len are left to be refused (and counted as context_too_long).

On a CPU machine the engine and the client are kept apart: the server runs under ``taskset`` on
``engine_cores`` with its OpenMP threads bound there (``VLLM_CPU_OMP_THREADS_BIND``), and the
deploying thread (the runner, and the worker processes it starts) is pinned to ``client_cores`` until
``close()``. The runner's send-lag check remains the judge of whether a step counts. A server that
dies during a step (e.g. ``RuntimeError: CPU Generator does not use offset``) fails that step's
requests as ``engine_crash`` with the log excerpt in ``meta["engine_crash"]``; later steps raise
``EngineError`` (the run is recorded invalid with the excerpt).

``endpoint.engine_options`` (all optional):
  model_path         model directory (default: the endpoint's ``model``); relative paths are read from
                     the spec file's directory
  python             interpreter with vLLM installed (default ``$AUTORESEARCH_VLLM_PYTHON``, else
                     ``.venv-vllm/bin/python`` under the current directory)
  served_model_name  the name requests use (default: the model directory's name)
  engine_cores       CPU list for the server, e.g. "1" or "2-7" (default: every core but the client's;
                     "" leaves it unpinned)
  client_cores       CPU list for the runner (default "0"; "" leaves it unpinned)
  kv_cache_gb        VLLM_CPU_KVCACHE_SPACE, the CPU KV cache in GiB (default 1)
  extra_args         further flags appended verbatim (e.g. [--dtype, bfloat16])
  env                extra environment variables for the server (values are not logged)
  startup_timeout_s  how long to wait for health (default 600)
  stop_grace_s       SIGTERM-to-SIGKILL grace (default 20)
  run_dir            where per-deployment directories go (default ``out/vllm-runs/<endpoint>``)
  launch_command     argv (list or string) replacing ``[python, -m, vllm.entrypoints.openai.api_server]``;
                     the tests point it at a stand-in server
  validate           run vLLM's parser before launching (default: true unless launch_command is set)
  adapt_pool         {strip_tools, strip_sampling, max_model_len, margin}: see ``pool.adapt``
  api_key_env, workers
  emulator_device    the catalog device the emulator models this endpoint on (``emulator.engine_view``)
  calibrate_params   the efficiency factors a campaign's calibration fits (``agents.surrogate``)
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from autoresearch_dagster.engines.base import (
    ConfigDriftError, EngineError, config_drift, http_request, run_engine_parser, server_seed,
)
from autoresearch_dagster.engines.sglang import ServerProcess, free_port
from autoresearch_dagster.loadgen.failures import CONTEXT_TOO_LONG, ENGINE_CRASH, UNSUPPORTED_FEATURE, tally
from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
from autoresearch_dagster.loadgen.records import ScheduledRequest, StepOutcome
from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.pool.adapt import PoolLimits, adapt_body, limits_from_options
from autoresearch_dagster.spec import VLLM_KNOBS, EndpointSpec, SpecError, config_hash, launch_flags, validate_server_config

VLLM_PYTHON_ENV = "AUTORESEARCH_VLLM_PYTHON"
DEFAULT_VENV_PYTHON = Path(".venv-vllm") / "bin" / "python"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# Where each knob's resolved value lies in vLLM's VllmConfig (as /server_info?config_format=json dumps it).
RESOLVED_PATHS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
    "long_prefill_token_threshold": ("scheduler_config", "long_prefill_token_threshold"),
    "scheduling_policy": ("scheduler_config", "policy"),
    "stream_interval": ("scheduler_config", "stream_interval"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "block_size": ("cache_config", "block_size"),
    "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "max_model_len": ("model_config", "max_model_len"),
    "dtype": ("model_config", "dtype"),
    "enforce_eager": ("model_config", "enforce_eager"),
    "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
}
assert set(RESOLVED_PATHS) == set(VLLM_KNOBS), "every vLLM knob needs the place its resolved value is reported"
REFUSALS = (CONTEXT_TOO_LONG, UNSUPPORTED_FEATURE)  # failures of the request itself, never the server's crash
CRASH_WAIT_S = 5.0  # after a step with server-side failures: how long a dying server gets to show it

_PARSER_SCRIPT = r"""
import contextlib, io, json, logging, sys
argvs = json.loads(sys.stdin.read())
try:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError as e:
    print(json.dumps({"installed": False, "error": str(e)}))
    sys.exit(0)
logging.disable(logging.WARNING)

def check(argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        validate_parsed_serve_args(args)
        AsyncEngineArgs.from_cli_args(args).create_engine_config()
    except SystemExit:
        lines = [l for l in err.getvalue().splitlines() if "error:" in l]
        return [lines[-1].strip() if lines else err.getvalue().strip()[-500:] or "argument parsing failed"]
    except Exception as e:
        msg = " ".join(str(e).split())
        return [f"{type(e).__name__}: {msg[:500]}"]
    return []

print(json.dumps({"installed": True, "errors": [check(a) for a in argvs]}))
"""


def vllm_python(python: str | None = None) -> str | None:
    """The interpreter with vLLM: the one given, ``$AUTORESEARCH_VLLM_PYTHON``, or ``.venv-vllm``'s."""
    if python:
        return python
    if os.environ.get(VLLM_PYTHON_ENV):
        return os.environ[VLLM_PYTHON_ENV]
    return str(DEFAULT_VENV_PYTHON.absolute()) if DEFAULT_VENV_PYTHON.exists() else None


def validate_with_vllm_parser(configs: list[dict[str, Any]], model_path: str, *, extra_args: list[str] | None = None,
                              python: str | None = None, env: dict[str, str] | None = None,
                              timeout_s: float = 300.0) -> list[list[str]] | None:
    """Errors vLLM's own parser and config builder report for each config ([] when valid); None when
    vLLM is not installed. A config the knob table already rejects gets that error without starting vLLM."""
    results: list[list[str] | None] = []
    argvs: list[list[str]] = []
    for config in configs:
        try:
            argvs.append(["--model", model_path] + launch_flags(config, "vllm") + [str(a) for a in extra_args or []])
            results.append(None)
        except SpecError as e:
            results.append([str(e)])
    if not argvs:
        return [r or [] for r in results]
    exe = vllm_python(python)
    if exe is None:
        return None
    return run_engine_parser(exe, _PARSER_SCRIPT, argvs, results, engine="vLLM", timeout_s=timeout_s, env=env)


def resolved_config(vllm_config: dict[str, Any]) -> dict[str, Any]:
    """Each vLLM knob's resolved value from a VllmConfig dump; knobs the dump lacks are left out."""
    out: dict[str, Any] = {}
    for name, (section, field) in RESOLVED_PATHS.items():
        sec = vllm_config.get(section)
        if isinstance(sec, dict) and field in sec:
            value = sec[field]
            if name == "dtype" and isinstance(value, str):
                value = value.removeprefix("torch.")
            out[name] = value
    return out


def vllm_argv(base: list[str], config: dict[str, Any], *, model_path: str, host: str, port: int, seed: int,
              served_model_name: str | None = None, extra_args: list[Any] | None = None) -> list[str]:
    """``base`` + the flags the harness always sets + ``launch_flags(config, "vllm")`` + extra args."""
    cmd = list(base) + ["--model", model_path, "--host", host, "--port", str(port), "--seed", str(server_seed(seed))]
    if served_model_name:
        cmd += ["--served-model-name", str(served_model_name)]
    return cmd + launch_flags(config, "vllm") + [str(a) for a in (extra_args or [])]


def parse_cpus(spec: str) -> set[int]:
    """'0', '1-3', '0,2-3' -> a CPU set; SpecError when malformed."""
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in str(spec).split(","))):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SpecError(f"CPU list {spec!r} is not like '1' or '2-7' or '0,2'") from None
    return cpus


def cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


_EXCEPTION_LINE = re.compile(r"(?:^|[\s\]])[A-Za-z_][\w.]*(?:Error|Exception): \S")


def _crash_excerpt(log: str, n_lines: int = 12) -> str:
    """The root cause in a server log: the first exception line outside WARNING/INFO lines, with the
    traceback lines before it (vLLM logs the worker's error first, then an EngineDeadError per request),
    else the log's tail."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    hits = [i for i, ln in enumerate(lines) if _EXCEPTION_LINE.search(ln) and " WARNING " not in ln
            and " INFO " not in ln]
    if not hits:
        return "\n".join(lines[-n_lines:])
    return "\n".join(lines[max(0, hits[0] - n_lines + 1):hits[0] + 1])


class VllmDeployment(HttpDeployment):
    """The runner's HTTP deployment of a vLLM server this engine started; closing it stops the server."""

    def __init__(self, base_url: str, process: ServerProcess, run_dir: Path, info: dict[str, Any], *,
                 restore_affinity: set[int] | None, adapt: PoolLimits | None = None, **kwargs: Any):
        super().__init__(base_url, **kwargs)
        self.adapt = adapt
        self.process = process
        self.run_dir = run_dir
        self.startup_info = info
        self._restore_affinity = restore_affinity

    def run_step(self, schedule: list[ScheduledRequest], *, step_id: str, timeout_s: float) -> StepOutcome:
        if not self.process.alive():
            raise EngineError(f"the vLLM server died (exit code {self.process.proc.returncode}); log "
                              f"{self.process.log_path}:\n{_crash_excerpt(self.process.log_tail(400_000))}")
        counts: dict[str, int] = {}
        if self.adapt is not None and (self.adapt.strip_tools or self.adapt.strip_sampling):
            adapted = []
            for s in schedule:
                body, changes = adapt_body(s.body, self.adapt)
                for c in changes:
                    counts[c] = counts.get(c, 0) + 1
                adapted.append(dataclasses.replace(s, body=body) if changes else s)
            schedule = adapted
        outcome = super().run_step(schedule, step_id=step_id, timeout_s=timeout_s)
        if counts:
            outcome.meta["request_adaptation"] = counts
        failed = [r for r in outcome.records if r.status != "ok" and r.error_class not in REFUSALS]
        if self._died(wait_s=CRASH_WAIT_S if failed else 0.0):
            excerpt = _crash_excerpt(self.process.log_tail(400_000))
            messages = {c: v["message"] for c, v in outcome.meta.get("failures", {}).items() if v.get("message")}
            for r in failed:
                r.error_class = ENGINE_CRASH
            messages[ENGINE_CRASH] = excerpt.splitlines()[-1] if excerpt else "the server stopped answering"
            outcome.meta["failures"] = tally(outcome.records, messages)
            outcome.meta["engine_crash"] = {"exit_code": self.process.proc.poll(), "log": str(self.process.log_path),
                                            "excerpt": excerpt, "failed_requests": len(failed)}
        return outcome

    def _died(self, *, wait_s: float) -> bool:
        """The server exited or its health check fails, now or within ``wait_s`` (a dead engine core
        fails its requests first; /health and the API server follow within seconds)."""
        deadline = time.monotonic() + wait_s
        while True:
            if not self.process.alive() or self._admin("GET", "/health", timeout=10.0)[0] != 200:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def server_info(self) -> dict[str, Any]:
        return self.startup_info

    def flush_cache(self) -> bool:
        status, body = self._admin("POST", "/reset_prefix_cache", timeout=40.0)
        try:
            return status == 200 and bool(json.loads(body).get("success", True))
        except ValueError:
            return status == 200

    def close(self) -> None:
        try:
            super().close()
        finally:
            code = self.process.stop()
            (self.run_dir / "exit_code").write_text(f"{code}\n")
            if self._restore_affinity is not None:
                os.sched_setaffinity(0, self._restore_affinity)
                self._restore_affinity = None


class VllmEngine:
    name = "vllm"
    restartable = True

    def __init__(self, endpoint: EndpointSpec, *, run_dir: str | Path | None = None, api_key_env: str | None = None,
                 workers: int = 1, settings: RunnerSettings | None = None) -> None:
        self.endpoint = endpoint
        self.opts = dict(endpoint.engine_options)
        self.model_path = self._model_path(str(self.opts.get("model_path") or endpoint.model))
        self.python = self.opts.get("python")
        self.host = str(self.opts.get("host", "127.0.0.1"))
        self.startup_timeout_s = float(self.opts.get("startup_timeout_s", 600))
        self.stop_grace_s = float(self.opts.get("stop_grace_s", 20))
        self.api_key_env = api_key_env or self.opts.get("api_key_env")
        self.model = str(self.opts.get("served_model_name") or Path(self.model_path).name)
        self.workers = int(self.opts.get("workers", workers))
        self.settings = settings
        self.run_root = Path(run_dir or self.opts.get("run_dir") or Path("out") / "vllm-runs" / endpoint.name)
        self.client_cpus, self.engine_cpus = self._cores()
        self._version: str | None = None

    def _model_path(self, path: str) -> str:
        p = Path(path)
        if not p.is_absolute() and self.endpoint.source_path:
            beside = Path(self.endpoint.source_path).parent / p
            if beside.exists():
                return str(beside.resolve())
        return str(p.resolve()) if p.exists() else path

    def _cores(self) -> tuple[set[int], set[int]]:
        available = os.sched_getaffinity(0)
        client = parse_cpus(self.opts.get("client_cores", "0"))
        engine_opt = self.opts.get("engine_cores")
        engine = parse_cpus(engine_opt) if engine_opt is not None else (available - client or available)
        for what, cpus in (("client_cores", client), ("engine_cores", engine)):
            if cpus - available:
                raise SpecError(f"engine_options.{what}: CPUs {cpu_list(cpus - available)} are not available "
                                f"(this process may use {cpu_list(available)})")
        return client, engine

    # ---------------------------------------------------------------- command
    def base_command(self) -> list[str]:
        custom = self.opts.get("launch_command")
        if custom:
            cmd = shlex.split(custom) if isinstance(custom, str) else [str(a) for a in custom]
        else:
            exe = vllm_python(self.python)
            if exe is None:
                raise EngineError(f"vLLM is not installed: run `make real-engine` (builds "
                                  f"{DEFAULT_VENV_PYTHON.parent.parent}) or set engine_options.python / ${VLLM_PYTHON_ENV}")
            cmd = [exe, "-m", SERVER_MODULE]
        return (["taskset", "-c", cpu_list(self.engine_cpus)] + cmd) if self.engine_cpus else cmd

    def launch_command(self, config: dict[str, Any], *, port: int, seed: int = 0) -> list[str]:
        return vllm_argv(self.base_command(), config, model_path=self.model_path, host=self.host, port=port, seed=seed,
                         served_model_name=self.model, extra_args=self.opts.get("extra_args", []))

    def server_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(self.opts.get("kv_cache_gb", 1)),
                    "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if self.engine_cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(self.engine_cpus)
        env.update({str(k): str(v) for k, v in (self.opts.get("env") or {}).items()})
        return env

    # ---------------------------------------------------------------- deploy
    def validate(self, configs: list[dict[str, Any]]) -> list[list[str]] | None:
        """vLLM's own verdict on each config (see ``validate_with_vllm_parser``)."""
        return validate_with_vllm_parser(configs, self.model_path, extra_args=self.opts.get("extra_args", []),
                                         python=self.python, env=self.server_env())

    def deploy(self, config: dict[str, Any], *, seed: int = 0) -> VllmDeployment:
        config = validate_server_config(dict(config), "vllm")
        if self.opts.get("validate", not self.opts.get("launch_command")):
            errors = self.validate([config])
            if errors is None:
                raise EngineError("vLLM is not installed: run `make real-engine` or set engine_options.python")
            if errors[0]:
                raise EngineError("vLLM's argument parser rejects this config: " + "; ".join(errors[0]))
        port = int(self.opts["port"]) if self.opts.get("port") else free_port(self.host)
        argv = self.launch_command(config, port=port, seed=seed)
        run_dir = self.run_root / f"{time.strftime('%Y%m%dT%H%M%S')}-{config_hash(config)}-s{seed}-p{port}"
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "launch.json", {
            "argv": argv, "config": config, "seed": seed, "port": port,
            "engine_cpus": cpu_list(self.engine_cpus), "client_cpus": cpu_list(self.client_cpus),
            "env_keys": sorted((self.opts.get("env") or {}).keys())}, sort_keys=True)
        proc = ServerProcess(argv, env=self.server_env(), log_path=run_dir / "server.log", grace_s=self.stop_grace_s)
        base_url = f"http://{self.host}:{port}"
        restore = None
        try:
            proc.wait_healthy(base_url, self.startup_timeout_s, name="the vLLM server", health_timeout_s=10, poll_s=0.5,
                              exit_log=lambda: _crash_excerpt(proc.log_tail(400_000)))
            info = self._server_info(base_url)
            write_json(run_dir / "server_info.json", info, sort_keys=True)
            drift = config_drift(config, info, "vllm")
            if drift:
                raise ConfigDriftError(drift)
            self._version = info["version"]
            if self.client_cpus:
                restore = os.sched_getaffinity(0)
                os.sched_setaffinity(0, self.client_cpus)
            dep = VllmDeployment(base_url, proc, run_dir, info, restore_affinity=restore,
                                 adapt=limits_from_options(self.endpoint), model=self.model,
                                 api_key_env=self.api_key_env, workers=self.workers, settings=self.settings)
        except BaseException:
            if restore is not None:
                os.sched_setaffinity(0, restore)
            proc.stop()
            raise
        return dep

    def _server_info(self, base_url: str) -> dict[str, Any]:
        """``{"version", "server_args": resolved knob values, "vllm_config": the full dump}``."""
        status, body = http_request(base_url + "/version", timeout=30)
        version = json.loads(body).get("version", "unknown") if status == 200 else "unknown"
        status, body = http_request(base_url + "/server_info?config_format=json", timeout=60)
        if status != 200:
            raise EngineError(f"{base_url}/server_info answered HTTP {status} (is VLLM_SERVER_DEV_MODE=1 set?)")
        vllm_config = json.loads(body).get("vllm_config") or {}
        return {"version": str(version), "engine": "vllm", "server_args": resolved_config(vllm_config),
                "vllm_config": vllm_config}

    def version(self) -> str:
        """The version the last deployment reported, else the installed vllm package's, else 'unknown'."""
        if self._version:
            return self._version
        exe = vllm_python(self.python)
        if exe is None:
            return "unknown"
        code = "import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n    try: print(m.version(d)); break\n" \
               "    except m.PackageNotFoundError: pass"
        out = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or "unknown"

