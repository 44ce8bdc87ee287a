"""Owns `autoresearch serve` (and `make up`): the deployment an operator runs, `dagster-webserver` and
`dagster-daemon` on the project's instance, so sensors, the automation sensor and the run queue are
evaluated by the daemon and runs are launched by Dagster's own run launcher.

Each server runs in a process group of its own (the daemon's code server and the run workers it
launches stay in the daemon's group); Ctrl-C or SIGTERM stops both groups, SIGTERM first, SIGKILL
after a grace period, and so does either server exiting on its own.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from autoresearch_dagster.definitions import PROJECT_ROOT
from autoresearch_dagster.spec import SpecError
from jobs.instance import gpu_slots, prepare_dagster_home

GRACE_S = 10.0
PG_VARS = ("AUTORESEARCH_PG_DIR", "DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USERNAME", "DAGSTER_PG_DB")


def _bin(name: str) -> str:
    """The Dagster executable beside this interpreter (the project's venv), else on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def server_commands(workspace: Path, host: str, port: int) -> dict[str, list[str]]:
    return {"webserver": [_bin("dagster-webserver"), "-w", str(workspace), "-h", host, "-p", str(port)],
            "daemon": [_bin("dagster-daemon"), "run", "-w", str(workspace)]}


def start_throwaway_postgres(env: dict[str, str]) -> str:
    """A throwaway cluster from scripts/pg.sh (removed when serve stops); its DAGSTER_PG_* go into ``env``."""
    out = subprocess.run(["bash", str(PROJECT_ROOT / "scripts/pg.sh"), "start"], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SpecError(f"scripts/pg.sh start failed: {out.stderr.strip().splitlines()[-1:] or out.returncode}")
    for line in out.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        if key in PG_VARS:
            env[key] = value
    os.environ.update({k: env[k] for k in PG_VARS if k in env})  # prepare_dagster_home reads them
    return env["AUTORESEARCH_PG_DIR"]


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL what is left of it after ``grace_s``; reap ``proc``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(proc.pid):
                return
            time.sleep(0.1)
    proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create_storage(root: Path) -> None:
    """Create the instance's tables once, before two servers race to create them (SQLite fails the loser)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(root)) as inst:
        inst.get_runs(limit=1)
        inst.event_log_storage.get_pool_limits()
        inst.schedule_storage.all_instigator_state()


def serve(*, home: str | Path | None = None, storage: str | None = None, workspace: Path | None = None,
          host: str = "127.0.0.1", port: int = 3000, env: dict[str, str] | None = None,
          say: Callable[[str], None] = print) -> int:
    """Render the instance, start webserver and daemon, and wait until a signal or one of them exits."""
    env = dict(os.environ if env is None else env)
    workspace = (workspace or PROJECT_ROOT / "workspace.yaml").resolve()
    storage = storage or env.get("AUTORESEARCH_DAGSTER_STORAGE", "sqlite")
    pg_dir = None
    if storage == "postgres" and not env.get("DAGSTER_PG_HOST"):
        pg_dir = start_throwaway_postgres(env)
        say(f"serve: throwaway PostgreSQL at {env['DAGSTER_PG_HOST']}:{env['DAGSTER_PG_PORT']} ({pg_dir}; "
            "removed at exit: set DAGSTER_PG_* to keep history)")
    stop = {"signal": 0}

    def _on_signal(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs: dict[str, subprocess.Popen] = {}
    try:
        root = prepare_dagster_home(home, storage)
        _create_storage(root)
        env["DAGSTER_HOME"] = str(root)
        env["AUTORESEARCH_DAGSTER_STORAGE"] = storage
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        logs = root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name, cmd in server_commands(workspace, host, port).items():
            with open(logs / f"{name}.log", "ab") as log:
                procs[name] = subprocess.Popen(cmd, cwd=workspace.parent, env=env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        say(f"serve: DAGSTER_HOME={root} ({storage}, {gpu_slots()} GPU slot(s)); UI http://{host}:{port}; "
            f"webserver pid {procs['webserver'].pid}, daemon pid {procs['daemon'].pid}; logs in {logs}")
        while not stop["signal"]:
            exited = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
            if exited:
                say(f"serve: {', '.join(f'{n} exited ({rc})' for n, rc in exited.items())}; stopping the rest")
                return 1
            time.sleep(0.5)
        say(f"serve: {signal.Signals(stop['signal']).name}: stopping webserver and daemon")
        return 0
    finally:
        for proc in procs.values():
            stop_group(proc)
        if pg_dir:
            subprocess.run(["bash", str(PROJECT_ROOT / "scripts/pg.sh"), "stop", pg_dir], check=False)
        for s, handler in previous.items():
            signal.signal(s, handler)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="run the deployment: dagster-webserver and dagster-daemon on the project's instance (make up)",
        description="Starts dagster-webserver and dagster-daemon on the instance at DAGSTER_HOME (default "
                    "./.dagster_home; SQLite, or PostgreSQL with --storage postgres), so the sensors, the "
                    "automation sensor and the run queue are evaluated by the daemon and runs are launched by "
                    "Dagster's run launcher. GPU slots: AUTORESEARCH_GPU_SLOTS, else the GPUs visible. "
                    "Ctrl-C or SIGTERM stops both.")
    p.add_argument("--dagster-home", help="instance directory (default $DAGSTER_HOME, else ./.dagster_home)")
    p.add_argument("--storage", choices=["sqlite", "postgres"],
                   help="instance storage (default $AUTORESEARCH_DAGSTER_STORAGE, else sqlite); postgres reads "
                        "DAGSTER_PG_HOST/PORT/USERNAME/DB, and starts a throwaway scripts/pg.sh cluster when unset")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument("--endpoints", help="endpoint spec directory the discovery sensor watches "
                                       "(default $AUTORESEARCH_ENDPOINTS, else examples/endpoints)")
    p.add_argument("--out", help="artifacts, results lake and memory (default $AUTORESEARCH_OUT, else ./out)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    for var, value in (("AUTORESEARCH_ENDPOINTS", args.endpoints), ("AUTORESEARCH_OUT", args.out)):
        if value:
            env[var] = str(Path(value).resolve())
    return serve(home=args.dagster_home, storage=args.storage, host=args.host, port=args.port, env=env,
                 say=lambda m: print(m, flush=True))


if __name__ == "__main__":
    from autoresearch_dagster.cli import OneLineParser

    parser = OneLineParser(prog="autoresearch")
    register(parser.add_subparsers(dest="group", required=True))
    sys.exit(handle(parser.parse_args(["serve", *sys.argv[1:]])))
