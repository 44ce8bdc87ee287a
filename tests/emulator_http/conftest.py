"""Fixtures for the emulator HTTP server tests: the demo endpoint, a scripted test-double core, running servers."""
from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import ScriptedCore
from autoresearch_dagster.spec import load_endpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def demo_endpoint():
    return load_endpoint(ROOT / "examples" / "endpoints" / "demo.yaml")


@pytest.fixture
def scripted_server(demo_endpoint):
    """Factory: a running server over a ScriptedCore; stopped at teardown."""
    from autoresearch_dagster.emulator.server import EmulatorServer, serve_in_thread

    started = []

    def make(core=None, **kw):
        core = core or ScriptedCore()
        srv = EmulatorServer(demo_endpoint, {}, core=core, **kw)
        rs = serve_in_thread(srv)
        started.append(rs)
        return rs, core

    yield make
    for rs in started:
        rs.stop()
