"""Fixtures the experiment CLI tests share: an endpoint + candidate + pool on disk, and a fake engine factory."""
from __future__ import annotations

import pytest
import yaml

import autoresearch_dagster.engines as engines

from .helpers import FakeEngine, make_pool


@pytest.fixture
def files(tmp_path):
    ep = tmp_path / "ep.yaml"
    ep.write_text(yaml.safe_dump({"name": "demo", "model": "gemma-moe-26b-a4b", "hardware": {"gpu": "H200", "count": 1},
                                  "sla": "ttft_p99<=1000ms,errors<=1%", "server_config": {}}))
    cand = tmp_path / "cand.yaml"
    cand.write_text(yaml.safe_dump({"schedule_policy": "lpm"}))
    make_pool(tmp_path)
    return ep, cand, tmp_path / "pool", tmp_path


@pytest.fixture
def fake_engine(monkeypatch):
    eng = FakeEngine(lambda c: 12.0 if c.get("schedule_policy") == "lpm" else 10.0, noise_cv=0.01)
    monkeypatch.setattr(engines, "make_engine", lambda endpoint, **kw: eng)
    return eng
