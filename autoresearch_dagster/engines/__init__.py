"""Owns the engine factory: ``make_engine(endpoint, **opts)`` builds the Engine an endpoint names.

``emulator`` -> EmulatorEngine (default), ``sglang`` -> SGLangEngine, ``vllm`` -> VllmEngine, ``modal`` -> ModalEngine,
``external`` -> ExternalEngine. Options an engine's constructor does not take are ignored, so
callers (CLI, Dagster resources) can pass one set of settings (``mode``, ``noise``, ...) to any kind.
An ``api_key`` value is never handed on as text: it is placed in this process's environment under
``AUTORESEARCH_ENGINE_API_KEY`` and engines receive the variable's name (``api_key_env``).
"""
from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

from autoresearch_dagster.spec import EndpointSpec, SpecError

API_KEY_ENV = "AUTORESEARCH_ENGINE_API_KEY"

_ENGINES = {
    "emulator": ("autoresearch_dagster.engines.emulator", "EmulatorEngine"),
    "sglang": ("autoresearch_dagster.engines.sglang", "SGLangEngine"),
    "vllm": ("autoresearch_dagster.engines.vllm", "VllmEngine"),
    "modal": ("autoresearch_dagster.engines.modal", "ModalEngine"),
    "external": ("autoresearch_dagster.engines.external", "ExternalEngine"),
}


def engine_class(kind: str) -> type:
    try:
        module, cls = _ENGINES[kind]
    except KeyError:
        raise SpecError(f"unknown engine {kind!r}; engines: {', '.join(_ENGINES)}") from None
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        raise SpecError(f"engine {kind!r} is not available: {e}") from None


def make_engine(endpoint: EndpointSpec, *, engine: str | None = None, **opts: Any) -> Any:
    """The Engine for ``endpoint`` (kind from the spec unless ``engine`` overrides it)."""
    kind = engine or endpoint.engine
    cls = engine_class(kind)
    api_key = opts.pop("api_key", None)
    if api_key:
        os.environ[API_KEY_ENV] = api_key
        opts.setdefault("api_key_env", API_KEY_ENV)
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in opts.items() if v is not None and (takes_any or k in params)}
    return cls(endpoint, **kwargs)
