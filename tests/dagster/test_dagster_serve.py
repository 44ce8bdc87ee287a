"""`autoresearch serve`: dagster-webserver and dagster-daemon on a fresh instance; the daemon alone
discovers a new endpoint spec and its sensor-launched run succeeds; SIGTERM stops both process groups."""
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest

from .conftest import ROOT
from .procs import free_port, group_alive


def _ui_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.timeout(150)
def test_serve_runs_what_the_daemon_launches_and_stops_on_sigterm(project, tmp_path):
    home, port, log = tmp_path / "home", free_port(), tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTORESEARCH_CANDIDATES": str(project / "candidates"),
           "AUTORESEARCH_GPU_SLOTS": "2"}
    env.pop("DAGSTER_HOME", None)
    with open(log, "w") as out:
        serve = subprocess.Popen([sys.executable, "-m", "jobs.serve", "--dagster-home", str(home), "--port", str(port),
                                  "--endpoints", str(project / "endpoints"), "--out", str(project / "out")],
                                 cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    pgids: list[int] = []
    try:
        deadline, run, ui = time.time() + 100, None, False
        while time.time() < deadline and serve.poll() is None:
            ui = ui or _ui_up(port)
            if "daemon pid" in log.read_text():  # serve created the instance's tables: safe to open it
                with dg.DagsterInstance.from_config(str(home)) as instance:
                    runs = instance.get_runs(dg.RunsFilter(tags={"dagster/sensor_name": "endpoint_discovery_sensor"}))
                    run = runs[0] if runs else None
                    if run is not None and run.is_finished and ui:
                        break
            time.sleep(1)
        text = log.read_text()
        assert serve.poll() is None, text
        assert ui, f"the webserver never answered /server_info\n{text}"
        assert run is not None, f"the daemon launched no discovery run in time\n{text}"
        assert run.status == dg.DagsterRunStatus.SUCCESS, text
        assert run.tags["dagster/partition"] == "ep1"
        with dg.DagsterInstance.from_config(str(home)) as instance:
            # queued by the sensor, then launched by the run launcher (an in-process run has neither event)
            for event in (dg.DagsterEventType.RUN_ENQUEUED, dg.DagsterEventType.RUN_STARTING):
                assert instance.all_logs(run.run_id, of_type=event), event
            assert instance.get_latest_materialization_event(dg.AssetKey("replay_pool")) is not None
            assert instance.get_latest_materialization_event(dg.AssetKey("confirmed_baseline")) is not None
            assert instance.global_op_concurrency_default_limit == 2  # the GPU slots serve rendered
        pgids = [int(p) for p in re.findall(r"(?:webserver|daemon) pid (\d+)", text)]
        assert len(pgids) == 2 and all(group_alive(p) for p in pgids)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=40) == 0, log.read_text()
        assert not [p for p in pgids if group_alive(p)], "a server's process group outlived serve"
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        for p in pgids:
            if group_alive(p):
                os.killpg(p, signal.SIGKILL)
