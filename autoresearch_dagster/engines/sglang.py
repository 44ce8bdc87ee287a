"""Owns the 'sglang' engine: a local SGLang server launched as a subprocess with the config as flags.

``deploy(config, seed)`` validates the config (the KNOBS table, then SGLang's own argument parser
when sglang is installed), launches ``python -m sglang.launch_server --model-path ... --host
127.0.0.1 --port <free> --enable-metrics --enable-cache-report --random-seed <seed>`` plus
``launch_flags(config)`` in its own process group, keeps the server log and the command in a run
directory, waits for ``/health`` (and ``/ready``), reads ``/server_info`` and refuses a server
whose resolved config differs from what was asked (config drift names the knob). The result is
the runner's ``HttpDeployment`` whose ``close()`` also stops the process group (SIGTERM, then
SIGKILL after a grace period). ``start_profile`` / ``stop_profile`` (the diagnosis window) keep SGLang's trace
files in the run directory as well as handing them to the caller (``SGLangDeployment``).

``endpoint.engine_options`` (all optional):
  model_path         model directory or HF id (default: the endpoint's ``model``)
  python             interpreter with sglang installed (default: this one)
  launch_command     argv (list or string) replacing ``[python, -m, sglang.launch_server]``;
                     tests point it at ``python -m autoresearch_dagster.tinymodel``
  extra_args         further flags appended verbatim
  env                extra environment variables for the server (values are not logged)
  startup_timeout_s  how long to wait for health (default 900)
  stop_grace_s       SIGTERM-to-SIGKILL grace (default 30)
  run_dir            where per-deployment directories go (default ``out/sglang-runs/<endpoint>``)
  served_model_name, api_key_env, workers
  validate           run SGLang's parser before launching (default: true unless launch_command is set)
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from autoresearch_dagster.engines.base import (
    ConfigDriftError, EngineError, config_drift, http_request, read_server_info, run_engine_parser, server_seed,
)
from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.spec import EndpointSpec, SpecError, config_hash, launch_flags, validate_server_config

SGLANG_PYTHON_ENV = "AUTORESEARCH_SGLANG_PYTHON"

_PARSER_SCRIPT = r"""
import contextlib, io, json, sys
argvs = json.loads(sys.stdin.read())
try:
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
except ImportError as e:
    print(json.dumps({"installed": False, "error": str(e)}))
    sys.exit(0)

def check(argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
        if getattr(args, "speculative_algorithm", None):
            SpeculativeAlgorithm.from_string(args.speculative_algorithm)
    except SystemExit:
        lines = [l for l in err.getvalue().splitlines() if "error:" in l]
        return [lines[-1].strip() if lines else err.getvalue().strip()[-500:] or "argument parsing failed"]
    except Exception as e:
        return [f"{type(e).__name__}: {e}"]
    return []

print(json.dumps({"installed": True, "errors": [check(a) for a in argvs]}))
"""


def _sglang_python(python: str | None) -> str | None:
    if python:
        return python
    if os.environ.get(SGLANG_PYTHON_ENV):
        return os.environ[SGLANG_PYTHON_ENV]
    return sys.executable if importlib.util.find_spec("sglang") is not None else None


def validate_with_sglang_parser(config: dict[str, Any], model_path: str, *, extra_args: list[str] | None = None,
                                python: str | None = None, timeout_s: float = 180.0) -> list[str] | None:
    """Errors SGLang's own parser reports for this config ([] when valid); None when sglang is not installed.

    A config the KNOBS table already rejects gets that error without starting SGLang.

    The parser (``sglang.srt.server_args.prepare_server_args``) runs on CPU in a child interpreter:
    ``python`` if given, else ``$AUTORESEARCH_SGLANG_PYTHON``, else this one when it has sglang. It
    parses and checks the speculative algorithm's name; it does not resolve defaults (that needs
    the model's config and happens at server start, which ``/server_info`` then reports).
    """
    out = validate_configs_with_sglang_parser([config], model_path, extra_args=[extra_args or []], python=python,
                                              timeout_s=timeout_s)
    return None if out is None else out[0]


def validate_configs_with_sglang_parser(configs: list[dict[str, Any]], model_path: str, *,
                                        extra_args: list[list[str]] | None = None, python: str | None = None,
                                        timeout_s: float = 300.0) -> list[list[str]] | None:
    """``validate_with_sglang_parser`` for many configs in one child interpreter (sglang imports once)."""
    extra_args = extra_args or [[] for _ in configs]
    if len(extra_args) != len(configs):
        raise ValueError("extra_args needs one list per config")
    results: list[list[str] | None] = []
    argvs: list[list[str]] = []
    for config, extra in zip(configs, extra_args):
        try:
            argvs.append(["--model-path", model_path] + launch_flags(config) + [str(a) for a in extra])
            results.append(None)
        except SpecError as e:
            results.append([str(e)])
    if not argvs:  # every config already failed the KNOBS table
        return [r or [] for r in results]
    exe = _sglang_python(python)
    if exe is None:
        return None
    return run_engine_parser(exe, _PARSER_SCRIPT, argvs, results, engine="SGLang", timeout_s=timeout_s)


def sglang_argv(base: list[str], config: dict[str, Any], *, model_path: str, host: str, port: int, seed: int,
                served_model_name: str | None = None, extra_args: list[Any] | None = None) -> list[str]:
    """``base`` + the server flags the harness always sets + ``launch_flags(config)`` + extra args."""
    cmd = list(base) + ["--model-path", model_path, "--host", host, "--port", str(port),
                        "--enable-metrics", "--enable-cache-report", "--random-seed", str(server_seed(seed))]
    if served_model_name:
        cmd += ["--served-model-name", str(served_model_name)]
    return cmd + launch_flags(config) + [str(a) for a in (extra_args or [])]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A launched server's process group; ``stop()`` sends SIGTERM to the group, then SIGKILL."""

    def __init__(self, argv: list[str], *, env: dict[str, str], log_path: Path, grace_s: float):
        self.argv, self.log_path, self.grace_s = argv, log_path, grace_s
        self._log = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        except OSError as e:
            self._log.close()
            raise EngineError(f"could not start the server ({argv[0]}): {e}") from None
        self.pgid = os.getpgid(self.proc.pid)
        self._finalizer = weakref.finalize(self, _kill_group, self.pgid, self.proc, self._log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_chars: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n_chars:].decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_healthy(self, base_url: str, timeout_s: float, *, name: str = "the server", health_timeout_s: float = 25,
                     poll_s: float = 0.25, ready: Callable[[], bool] | None = None,
                     exit_log: Callable[[], str] | None = None) -> None:
        """Poll ``/health`` until it answers 200 (and ``ready()``, when given, is true); EngineError with the log's
        tail (``exit_log()`` when the process exited, if given) when the process dies or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise EngineError(f"{name} exited with code {self.proc.returncode} before becoming healthy; "
                                  f"log {self.log_path}:\n{exit_log() if exit_log else self.log_tail()}")
            if http_request(base_url + "/health", timeout=health_timeout_s)[0] == 200 and (ready is None or ready()):
                return
            if time.monotonic() > deadline:
                raise EngineError(f"{name} did not become healthy within {timeout_s:g} s; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(poll_s)

    def stop(self) -> int | None:
        """Stop the whole process group; returns the server's exit code."""
        if self._finalizer.alive:
            self._finalizer.detach()
            _stop_group(self.pgid, self.proc, self.grace_s)
            self._log.close()
        return self.proc.returncode


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(pgid: int, proc: subprocess.Popen, grace_s: float) -> None:
    _signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(pgid, signal.SIGKILL)  # also reaps children the server left in its group
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _kill_group(pgid: int, proc: subprocess.Popen, log) -> None:
    _stop_group(pgid, proc, 0.0)
    log.close()


class SGLangDeployment(HttpDeployment):
    """The runner's HTTP deployment of a server this engine started; closing it stops the server.

    Profiling (``start_profile`` / ``stop_profile`` around the diagnosis window) writes SGLang's per-rank
    traces into the run's directory (``<run_dir>/profiles/<n>/``, beside ``server.log``; the server shares
    this filesystem), waits for them to be complete, copies them to where the caller asked, and records
    each window in ``<run_dir>/profiles.json`` (request, HTTP answers, files, errors). A window still open
    when the deployment closes (a failed step) is stopped first, so its trace is kept; then the process
    group goes, even when that stop fails."""

    TRACE_SUFFIXES = (".trace.json.gz", ".trace.json")

    def __init__(self, base_url: str, process: ServerProcess, run_dir: Path, info: dict[str, Any], **kwargs: Any):
        super().__init__(base_url, **kwargs)
        self.process = process
        self.run_dir = run_dir
        self.startup_info = info
        self.profile_wait_s = 60.0
        self._window: dict[str, Any] | None = None
        self._windows: list[dict[str, Any]] = []

    def _record(self) -> None:
        write_json(self.run_dir / "profiles.json", self._windows, sort_keys=True)

    def start_profile(self, output_dir: str) -> None:
        """POST /start_profile with the trace directory inside the run's directory; RuntimeError (with the
        server's answer and its log's tail) when the server refuses."""
        if self._window is not None:
            raise EngineError("start_profile while a profile window is open: call stop_profile first")
        n = len(self._windows)
        server_dir = self.run_dir / "profiles" / f"{n:02d}"
        server_dir.mkdir(parents=True, exist_ok=True)
        body = {"output_dir": str(server_dir.resolve()), "profile_id": f"window{n:02d}", "activities": ["CPU", "GPU"]}
        window = {"index": n, "request": body, "copy_to": str(output_dir), "started_at": time.time(), "files": []}
        self._windows.append(window)
        status, answer = self._admin("POST", "/start_profile", body, timeout=60.0)
        window["start_status"] = status
        if status != 200:
            window["error"] = f"/start_profile answered HTTP {status}: {answer[:300].decode('utf-8', 'replace')}"
            self._record()
            raise EngineError(f"{window['error']}; server log {self.process.log_path}:\n{self.process.log_tail(800)}")
        self._window = window
        self._record()

    def _traces(self, server_dir: Path) -> list[Path]:
        return sorted(p for p in server_dir.rglob("*") if p.is_file() and p.name.endswith(self.TRACE_SUFFIXES))

    def _wait_for_traces(self, server_dir: Path) -> list[Path]:
        """The trace files once their sizes stop changing (SGLang writes them after answering), within
        ``profile_wait_s``; what is there by then otherwise."""
        deadline, last = time.monotonic() + self.profile_wait_s, None
        while True:
            files = self._traces(server_dir)
            sizes = [(p.name, p.stat().st_size) for p in files]
            if files and sizes == last:
                return files
            if time.monotonic() > deadline or not self.process.alive():
                return files
            last = sizes
            time.sleep(0.2)

    def stop_profile(self) -> list[str]:
        """POST /stop_profile and collect the window's traces: kept in the run's directory, copied to the
        directory ``start_profile`` was given; returns the copies ([] when the server wrote none)."""
        import shutil

        window, self._window = self._window, None
        if window is None:
            return []
        status, answer = self._admin("POST", "/stop_profile", timeout=120.0)
        window.update(stop_status=status, stopped_at=time.time())
        if status != 200:
            window["error"] = f"/stop_profile answered HTTP {status}: {answer[:300].decode('utf-8', 'replace')}"
        server_dir = Path(window["request"]["output_dir"])
        traces = self._wait_for_traces(server_dir) if status == 200 else self._traces(server_dir)
        dest = Path(window["copy_to"])
        dest.mkdir(parents=True, exist_ok=True)
        copies = []
        for p in traces:
            target = dest / p.name
            if target.resolve() != p.resolve():
                shutil.copy2(p, target)
            copies.append(str(target))
        window["files"] = [str(p) for p in traces]
        self._record()
        return copies

    def close(self) -> None:
        try:
            if self._window is not None and self.process.alive():
                try:
                    self.stop_profile()
                except Exception as e:  # noqa: BLE001 - the server must go whatever its profiler does
                    self._windows[-1]["error"] = f"stop_profile at close failed: {e}"
                    self._record()
            super().close()
        finally:
            code = self.process.stop()
            (self.run_dir / "exit_code").write_text(f"{code}\n")


class SGLangEngine:
    name = "sglang"
    restartable = True

    def __init__(self, endpoint: EndpointSpec, *, run_dir: str | Path | None = None, api_key_env: str | None = None,
                 workers: int = 1, settings: RunnerSettings | None = None) -> None:
        self.endpoint = endpoint
        self.opts = dict(endpoint.engine_options)
        self.model_path = str(self.opts.get("model_path") or endpoint.model)
        self.python = self.opts.get("python")
        self.host = str(self.opts.get("host", "127.0.0.1"))
        self.startup_timeout_s = float(self.opts.get("startup_timeout_s", 900))
        self.stop_grace_s = float(self.opts.get("stop_grace_s", 30))
        self.api_key_env = api_key_env or self.opts.get("api_key_env")
        self.model = self.opts.get("served_model_name")
        self.workers = int(self.opts.get("workers", workers))
        self.settings = settings
        self.run_root = Path(run_dir or self.opts.get("run_dir") or Path("out") / "sglang-runs" / endpoint.name)
        self._version: str | None = None

    # ---------------------------------------------------------------- command
    def base_command(self) -> list[str]:
        custom = self.opts.get("launch_command")
        if custom:
            return shlex.split(custom) if isinstance(custom, str) else [str(a) for a in custom]
        return [self.python or sys.executable, "-m", "sglang.launch_server"]

    def launch_command(self, config: dict[str, Any], *, port: int, seed: int = 0) -> list[str]:
        """The full argv for a config (validated against KNOBS; SpecError names a bad knob)."""
        return sglang_argv(self.base_command(), config, model_path=self.model_path, host=self.host, port=port,
                           seed=seed, served_model_name=self.model, extra_args=self.opts.get("extra_args", []))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (self.opts.get("env") or {}).items()})
        return env

    # ---------------------------------------------------------------- deploy
    def deploy(self, config: dict[str, Any], *, seed: int = 0) -> SGLangDeployment:
        config = validate_server_config(dict(config))
        if self.opts.get("validate", not self.opts.get("launch_command")):
            errors = validate_with_sglang_parser(config, self.model_path,
                                                 extra_args=[str(a) for a in self.opts.get("extra_args", [])],
                                                 python=self.python)
            if errors:
                raise EngineError("SGLang's argument parser rejects this config: " + "; ".join(errors))
        port = int(self.opts["port"]) if self.opts.get("port") else free_port(self.host)
        argv = self.launch_command(config, port=port, seed=seed)
        run_dir = self.run_root / f"{time.strftime('%Y%m%dT%H%M%S')}-{config_hash(config)}-s{seed}-p{port}"
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "launch.json", {"argv": argv, "config": config, "seed": seed, "port": port,
                                              "env_keys": sorted((self.opts.get("env") or {}).keys())},
                   sort_keys=True)
        proc = ServerProcess(argv, env=self._env(), log_path=run_dir / "server.log", grace_s=self.stop_grace_s)
        base_url = f"http://{self.host}:{port}"
        try:
            # /ready is newer than /health; older servers lack it (404)
            proc.wait_healthy(base_url, self.startup_timeout_s,
                              ready=lambda: http_request(base_url + "/ready", timeout=10)[0] in (200, 404))
            info = read_server_info(base_url, timeout=30)
            write_json(run_dir / "server_info.json", info, sort_keys=True)
            drift = config_drift(config, info)
            if drift:
                raise ConfigDriftError(drift)
            self._version = str(info.get("version") or self._version or "unknown")
            dep = SGLangDeployment(base_url, proc, run_dir, info, model=self.model, api_key_env=self.api_key_env,
                                   workers=self.workers, settings=self.settings)
        except BaseException:
            proc.stop()
            raise
        return dep

    def version(self) -> str:
        """The version the last deployment reported, else the installed sglang package's, else 'unknown'."""
        if self._version:
            return self._version
        exe = _sglang_python(self.python)
        if exe == sys.executable:
            try:
                return importlib.metadata.version("sglang")
            except importlib.metadata.PackageNotFoundError:
                return "unknown"
        if exe:
            out = subprocess.run([exe, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        return "unknown"
