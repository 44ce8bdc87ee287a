"""Owns the 'modal' engine: the sglang engine's server run in a Modal GPU sandbox behind a TLS tunnel.

``deploy(config, seed)`` looks up (or creates) a ``modal.App``, starts a ``modal.Sandbox`` on the
endpoint's GPUs with an SGLang image running ``python3 -m sglang.launch_server`` with the same
flags the local engine uses, opens an encrypted tunnel to the server port, waits for ``/health``,
reads ``/server_info`` and refuses config drift, and returns the runner's ``HttpDeployment`` on the
tunnel URL; ``close()`` terminates the sandbox. It needs Modal credentials in the environment
(``MODAL_TOKEN_ID`` / ``MODAL_TOKEN_SECRET``); without them ``deploy`` raises ``EngineError``.

``endpoint.engine_options`` (all optional):
  modal_app          app name (default ``autoresearch-sglang``)
  image              container image with SGLang (default ``lmsysorg/sglang:v0.5.23``; check the tag you use)
  model_path         model path inside the container or HF id (default: the endpoint's ``model``)
  volumes            {mount path: Modal volume name}, e.g. {"/models": "weights"}
  secrets            names of Modal secrets to attach (e.g. one holding HF_TOKEN)
  port               server port inside the sandbox (default 30000)
  startup_timeout_s  wait for health (default 1800: image pull + weight load)
  sandbox_timeout_s  the sandbox's maximum lifetime (default 14400)
  extra_args, served_model_name, api_key_env, workers
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from autoresearch_dagster.engines.base import (
    ConfigDriftError, EngineError, config_drift, http_request, read_server_info,
)
from autoresearch_dagster.engines.sglang import sglang_argv
from autoresearch_dagster.loadgen.http_runner import HttpDeployment, RunnerSettings
from autoresearch_dagster.spec import EndpointSpec, validate_server_config

CREDENTIAL_ENV = ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.23"


@dataclass(frozen=True)
class ModalLaunchPlan:
    """Everything ``deploy`` hands to Modal, computed without touching the network."""
    app_name: str
    image: str
    gpu: str
    argv: list[str]
    port: int
    sandbox_timeout_s: int
    startup_timeout_s: float
    volumes: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)


def modal_credentials_present() -> bool:
    return all(os.environ.get(k) for k in CREDENTIAL_ENV)


class ModalDeployment(HttpDeployment):
    """The runner's HTTP deployment on a sandbox's tunnel; closing it terminates the sandbox."""

    def __init__(self, base_url: str, sandbox: Any, info: dict[str, Any], plan: ModalLaunchPlan, **kwargs: Any):
        super().__init__(base_url, **kwargs)
        self.sandbox = sandbox
        self.startup_info = info
        self.plan = plan

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.sandbox.terminate()


class ModalEngine:
    name = "modal"
    restartable = True

    def __init__(self, endpoint: EndpointSpec, *, api_key_env: str | None = None, workers: int = 1,
                 settings: RunnerSettings | None = None) -> None:
        self.endpoint = endpoint
        self.opts = dict(endpoint.engine_options)
        self.api_key_env = api_key_env or self.opts.get("api_key_env")
        self.workers = int(self.opts.get("workers", workers))
        self.settings = settings
        self._version: str | None = None

    def plan(self, config: dict[str, Any], *, seed: int = 0) -> ModalLaunchPlan:
        hw = self.endpoint.hardware
        port = int(self.opts.get("port", 30000))
        argv = sglang_argv(["python3", "-m", "sglang.launch_server"], validate_server_config(dict(config)),
                           model_path=str(self.opts.get("model_path") or self.endpoint.model), host="0.0.0.0",
                           port=port, seed=seed, served_model_name=self.opts.get("served_model_name"),
                           extra_args=self.opts.get("extra_args", []))
        return ModalLaunchPlan(
            app_name=str(self.opts.get("modal_app", "autoresearch-sglang")),
            image=str(self.opts.get("image", DEFAULT_IMAGE)),
            gpu=hw.gpu if hw.count == 1 else f"{hw.gpu}:{hw.count}",
            argv=argv, port=port,
            sandbox_timeout_s=int(self.opts.get("sandbox_timeout_s", 14400)),
            startup_timeout_s=float(self.opts.get("startup_timeout_s", 1800)),
            volumes={str(k): str(v) for k, v in (self.opts.get("volumes") or {}).items()},
            secrets=[str(s) for s in self.opts.get("secrets", [])])

    def deploy(self, config: dict[str, Any], *, seed: int = 0) -> ModalDeployment:
        plan = self.plan(config, seed=seed)
        if not modal_credentials_present():
            raise EngineError("the modal engine needs Modal credentials: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET "
                              "in the environment (or use engine 'sglang' on a local GPU)")
        import modal

        try:
            app = modal.App.lookup(plan.app_name, create_if_missing=True)
            sandbox = modal.Sandbox.create(
                *plan.argv, app=app, image=modal.Image.from_registry(plan.image), gpu=plan.gpu,
                timeout=plan.sandbox_timeout_s, encrypted_ports=[plan.port],
                secrets=[modal.Secret.from_name(s) for s in plan.secrets],
                volumes={path: modal.Volume.from_name(name) for path, name in plan.volumes.items()})
        except modal.Error as e:
            raise EngineError(f"Modal refused the sandbox for app {plan.app_name!r}: {e}") from None
        try:
            base_url = sandbox.tunnels(timeout=120)[plan.port].url.rstrip("/")
            self._wait_healthy(sandbox, base_url, plan.startup_timeout_s)
            info = read_server_info(base_url, timeout=60)
            drift = config_drift(validate_server_config(dict(config)), info)
            if drift:
                raise ConfigDriftError(drift)
            self._version = str(info.get("version") or "unknown")
            return ModalDeployment(base_url, sandbox, info, plan, model=self.opts.get("served_model_name"),
                                   api_key_env=self.api_key_env, workers=self.workers, settings=self.settings)
        except BaseException:
            sandbox.terminate()
            raise

    @staticmethod
    def _wait_healthy(sandbox: Any, base_url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = sandbox.poll()
            if code is not None:
                raise EngineError(f"the SGLang sandbox exited with code {code} before becoming healthy: "
                                  f"{sandbox.stderr.read()[-2000:]}")
            if http_request(base_url + "/health", timeout=25)[0] == 200:
                return
            if time.monotonic() > deadline:
                raise EngineError(f"the SGLang sandbox did not become healthy within {timeout_s:g} s")
            time.sleep(2.0)

    def version(self) -> str:
        """The deployed server's version; before the first deploy, the release the image's tag names."""
        from autoresearch_dagster.engines.modal_app import image_engine_version

        return self._version or image_engine_version(str(self.opts.get("image", DEFAULT_IMAGE)))
