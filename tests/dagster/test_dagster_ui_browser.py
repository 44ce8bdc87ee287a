"""The Dagster UI in a real browser: the loop's first assets are materialized on a SQLite instance, the
project's webserver serves it, and headless Chromium (installed by scripts/browser.sh from Debian's
packages) opens the lineage and the noise baseline's page: the graph shows the loop's assets around the
baseline, the page its latest materialization, and the report's embedded load-curve plot (p50/p95/p99,
the capacity marker, the noise band) decodes as an image. Screenshots are kept in test-artifacts/ui/."""
import asyncio
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import dagster as dg
import pytest

from jobs.instance import execute, prepare_dagster_home
from jobs.serve import _bin, _create_storage
from resources import MeasurementSettings
from .browser import Browser, chromium_path
from .conftest import ROOT, make_defs, write_spec
from .procs import free_port

ARTIFACTS = ROOT / "test-artifacts" / "ui"
SMALL = MeasurementSettings(step_duration_s=10.0, min_completed=60, warmup_s=2.0, start_rps=8.0, max_steps=12,
                            resolution=0.1, noise_runs=5, quick_diagnosis=True, diagnosis_probes=False)
ASSETS = [dg.AssetKey("replay_pool"), dg.AssetKey("confirmed_baseline"), dg.AssetKey("noise_baseline")]

if not chromium_path():
    if os.environ.get("AUTORESEARCH_REQUIRE_BROWSER"):
        raise RuntimeError("scripts/test.sh requires chromium and none was found")
    pytest.skip("no chromium: `make test` installs it (scripts/browser.sh)", allow_module_level=True)


def _up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def materialized(tmp_path):
    """Endpoint ep1 over the demo log's first minutes, its pool, baseline and noise floor materialized."""
    logs, specs = tmp_path / "logs", tmp_path / "endpoints"
    logs.mkdir(), specs.mkdir(), (tmp_path / "candidates").mkdir()
    head = (ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines(keepends=True)[:600]
    (logs / "chat.jsonl").write_text("".join(head))
    write_spec(specs, "ep1", [logs / "chat.jsonl"])
    home = prepare_dagster_home(tmp_path / "home", "sqlite")
    _create_storage(home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("endpoints", ["ep1"])
        assert execute(make_defs(tmp_path, SMALL), instance, "ep1", ASSETS).success
    return tmp_path, home


@pytest.fixture
def webserver(materialized, tmp_path):
    project, home = materialized
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT),
           "AUTORESEARCH_OUT": str(project / "out"), "AUTORESEARCH_ENDPOINTS": str(project / "endpoints")}
    log = open(tmp_path / "webserver.log", "w")
    proc = subprocess.Popen([_bin("dagster-webserver"), "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1",
                             "-p", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 90
        while not _up(port):
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "webserver.log").read_text()
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()


async def _visit(base: str) -> dict:
    out = {}
    async with Browser() as page:
        await page.goto(f"{base}/assets/noise_baseline?view=lineage")
        out["lineage"] = await page.wait_for_text("replay_pool", "confirmed_baseline", "diagnostic_report", "proposals")
        await page.click_text("Skip")  # the first visit's newsletter dialog
        await asyncio.sleep(1)
        out["lineage_png"] = await page.screenshot(ARTIFACTS / "lineage.png")

        await page.goto(f"{base}/assets/noise_baseline?partition=ep1")
        out["asset"] = await page.wait_for_text("Latest materialization", "capacity_rps", "[Show Markdown]")
        assert await page.click_text("[Show Markdown]")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out["images"] = [i for i in await page.images() if i["src"].startswith("data:image/png")]
            if out["images"] and all(i["complete"] for i in out["images"]):
                break
            await asyncio.sleep(0.5)
        out["dialog"] = await page.text()
        out["asset_png"] = await page.screenshot(ARTIFACTS / "noise_baseline_report.png")
    return out


@pytest.mark.timeout(240)
def test_lineage_and_the_load_curve_plot_render_in_chromium(webserver):
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    seen = asyncio.run(_visit(webserver))
    assert "engine_version" in seen["lineage"]  # the observable source feeding the baseline's lineage
    assert "ep1" in seen["asset"] and "Traceback" not in seen["asset"]
    assert "median capacity" in seen["dialog"] and "req/s" in seen["dialog"]  # the report's text
    (plot,) = seen["images"]  # the load curves, embedded as a data URI, decoded by the browser
    assert plot["width"] >= 800 and plot["height"] >= 300
    for shot in (seen["lineage_png"], seen["asset_png"]):
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
