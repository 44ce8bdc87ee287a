"""A killed parent takes its worker processes with it (no orphans after SIGKILL or the OOM killer)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest



def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _spawn_parent(script: str) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    line = proc.stdout.readline()
    assert line.startswith("PIDS "), line
    return proc, [int(x) for x in line.split()[1:]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("pool", ["parallel", "grid"])
def test_workers_exit_when_parent_is_killed(pool):
    if pool == "parallel":
        start = "from autoresearch_dagster.experiments import parallel\nex = parallel._executor(2)\n"
    else:  # any pool built with the shared initializer, as grid and pool builds do
        start = ("from concurrent.futures import ProcessPoolExecutor\nimport multiprocessing as mp\n"
                 "from autoresearch_dagster.workers import pool_initializer\n"
                 "ex = ProcessPoolExecutor(2, mp_context=mp.get_context('spawn'), **pool_initializer())\n")
    script = start + textwrap.dedent("""
        import os, sys, time
        futs = [ex.submit(time.sleep, 0.3) for _ in range(4)]
        [f.result() for f in futs]
        print("PIDS", *sorted(ex._processes), flush=True)
        time.sleep(600)
    """)
    proc, pids = _spawn_parent(script)
    try:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "workers outlived their killed parent"
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()


def test_without_the_watch_a_worker_would_be_orphaned():
    """The failure this guards against is real: a plain spawn pool's workers survive the parent."""
    script = textwrap.dedent("""
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing as mp, time
        ex = ProcessPoolExecutor(1, mp_context=mp.get_context('spawn'))
        ex.submit(time.sleep, 0.1).result()
        print("PIDS", *sorted(ex._processes), flush=True)
        time.sleep(600)
    """)
    proc, pids = _spawn_parent(script)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(2.0)
        assert any(_alive(p) for p in pids)
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
