"""Owns the 'external' engine: an existing OpenAI-compatible endpoint, measured as it is.

It cannot restart or reconfigure the server, so it serves baseline measurement only: ``deploy``
accepts exactly the endpoint's own server config and refuses any other with ``EngineError``.
"""
from __future__ import annotations

from typing import Any

from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
from autoresearch_dagster.spec import EndpointSpec, config_hash, validate_server_config


class ExternalEngine:
    name = "external"
    restartable = False

    def __init__(self, endpoint: EndpointSpec, *, url: str | None = None, api_key_env: str | None = None,
                 workers: int = 1, settings: RunnerSettings | None = None) -> None:
        self.endpoint = endpoint
        self.url = url or endpoint.url
        if not self.url:
            raise EngineError(f"endpoint {endpoint.name!r}: the external engine needs a url")
        opts = endpoint.engine_options
        self.api_key_env = api_key_env or opts.get("api_key_env")
        self.model = opts.get("served_model_name")
        self.workers = int(opts.get("workers", workers))
        self.settings = settings

    def deploy(self, config: dict[str, Any], *, seed: int = 0) -> HttpDeployment:
        wanted = validate_server_config(dict(config))
        if config_hash(wanted) != config_hash(self.endpoint.server_config):
            raise EngineError(
                f"endpoint {self.endpoint.name!r} is external (not restartable): it can only be measured with "
                f"its own server config {self.endpoint.server_config}, not {wanted}")
        dep = HttpDeployment(self.url, model=self.model, api_key_env=self.api_key_env, workers=self.workers,
                             settings=self.settings)
        if not dep.health():
            raise EngineError(f"external endpoint {self.url} is not answering /health or /v1/models")
        return dep

    def version(self) -> str:
        info = HttpDeployment(self.url, api_key_env=self.api_key_env).server_info()
        return str(info.get("version") or "unknown")
