"""make_engine: the spec's engine kind, overrides, option filtering, API keys only via the environment."""
from __future__ import annotations

import pytest

from autoresearch_dagster.engines import API_KEY_ENV, make_engine
from autoresearch_dagster.spec import EndpointSpec, SpecError


def _ep(**kw):
    return EndpointSpec(**{"name": "demo", "model": "gemma-moe-26b-a4b", "hardware": {"gpu": "H200"},
                           "sla": "ttft_p99<=3000ms", **kw})


def test_default_is_the_emulator_and_unknown_options_are_dropped():
    eng = make_engine(_ep(), mode="virtual", noise=None, unknown_option=3)
    assert eng.name == "emulator" and eng.restartable


def test_external_gets_the_api_key_by_variable_name(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    eng = make_engine(_ep(engine="external", url="http://127.0.0.1:9"), api_key="s3cret")
    assert eng.name == "external" and not eng.restartable
    assert eng.api_key_env == API_KEY_ENV
    import os
    assert os.environ[API_KEY_ENV] == "s3cret"
    assert "s3cret" not in repr(vars(eng))


def test_unknown_engine_is_a_spec_error():
    with pytest.raises(SpecError, match="unknown engine 'gpu9000'"):
        make_engine(_ep(), engine="gpu9000")
