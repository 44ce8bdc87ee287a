"""Owns the Modal app that measures a config next to its server: one GPU function whose container launches
SGLang with the candidate config and runs the replay there, returning the run's record (per-step
latencies and capacity, the server's ``/server_info``, a ``/metrics`` snapshot, invalid reasons).

The function body, ``run_measurement(request)``, is plain Python over the project's own harness
(``experiments.runs.execute_run``: deploy, drift check, warm-up, capacity search, close), so it runs the
same way locally: with ``request["engine"] = "emulator"`` it measures the embedded emulator, which is
how it is tested and the offline default; in the container it is ``"sglang"`` on the container's GPUs.
``build_app`` defines the ``modal.App`` (image from the registry with the project's package added, GPU
type and count from the endpoint, timeout) without touching the network; ``run_remote`` runs the
function on Modal (credentials from Modal's own configuration or ``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``).
The engine's version is known before any deploy: ``image_engine_version`` reads it from the image tag.
A request carries the replay pool's Parquet bytes, so the container needs no shared volume.
"""
from __future__ import annotations

import base64
import re
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.23"
APP_NAME = "autoresearch-measure"
# what the container installs beside SGLang's image to run the harness (the runner, the pool reader)
CONTAINER_PACKAGES = ("pyarrow", "numpy", "scipy", "pydantic", "pyyaml", "aiohttp", "rich")


def image_engine_version(image: str) -> str:
    """The SGLang release an image runs, from its tag (``lmsysorg/sglang:v0.5.23-cu126`` -> ``0.5.23``);
    ``unknown`` for an untagged or non-release image."""
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    m = re.match(r"v?(\d+\.\d+(?:\.\d+)*(?:\.post\d+|rc\d+)?)", tag)
    return m.group(1) if m else "unknown"


def measurement_request(endpoint: Any, config: dict[str, Any], pool_file: str | Path, *, seed: int = 0,
                        profile: str = "standard", engine: str = "sglang", purpose: str = "noise") -> dict[str, Any]:
    """Everything the function needs, JSON-safe: the endpoint spec, the config, the pool's bytes."""
    pool = Path(pool_file)
    pool = pool / "replay_pool.parquet" if pool.is_dir() else pool
    return {"endpoint": endpoint.model_dump(mode="json"), "config": dict(config), "seed": int(seed),
            "profile": profile, "engine": engine, "purpose": purpose,
            "pool_parquet_b64": base64.b64encode(pool.read_bytes()).decode()}


class _MetricsAtClose:
    """An engine whose deployments snapshot ``/metrics`` just before they close (the run's end state)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.name, self.metrics_text = engine, getattr(engine, "name", type(engine).__name__), None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.engine, attr)

    def deploy(self, config: dict[str, Any], *, seed: int = 0) -> Any:
        dep = self.engine.deploy(config, seed=seed)
        close = dep.close

        def close_after_snapshot() -> None:
            try:
                self.metrics_text = dep.metrics_text()
            except Exception as e:  # noqa: BLE001 -- a server without /metrics still closes
                self.metrics_text = f"# no metrics: {type(e).__name__}: {e}"
            close()

        dep.close = close_after_snapshot
        return dep


def run_measurement(request: dict[str, Any]) -> dict[str, Any]:
    """The function body: one fresh deployment of ``request['config']`` measured once by the project's
    harness on ``request['engine']`` (``sglang`` in the container, ``emulator`` locally). Never raises for
    engine trouble: an invalid run comes back with its reasons."""
    from autoresearch_dagster.engines import make_engine
    from autoresearch_dagster.experiments.runs import HarnessSettings, execute_run, plain
    from autoresearch_dagster.measure.profiles import measurement_profile
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.spec import EndpointSpec

    endpoint = EndpointSpec.model_validate(request["endpoint"])
    profile = measurement_profile(str(request.get("profile", "standard")))
    with tempfile.TemporaryDirectory(prefix="measure-") as tmp:
        path = Path(tmp) / "replay_pool.parquet"
        path.write_bytes(base64.b64decode(request["pool_parquet_b64"]))
        pool = read_pool(path)
        engine = _MetricsAtClose(make_engine(endpoint, engine=str(request.get("engine", "sglang"))))
        rec = execute_run(endpoint, dict(request["config"]), pool, engine=engine, arm="remote", run_index=0,
                          seed=int(request.get("seed", 0)), purpose=str(request.get("purpose", "noise")),
                          settings=HarnessSettings(capacity=profile.capacity), mode="capacity")
    out = plain(rec)
    out["metrics_text"] = engine.metrics_text
    return out


def build_app(*, name: str = APP_NAME, image: str = DEFAULT_IMAGE, gpu: str = "H100",
              timeout_s: int = 3600) -> tuple[Any, Any]:
    """``(modal.App, its Function)``: ``run_measurement`` as the app's GPU function (defined offline;
    nothing is sent until the app runs)."""
    import modal

    app = modal.App(name)
    img = (modal.Image.from_registry(image).pip_install(*CONTAINER_PACKAGES)
           .add_local_python_source("autoresearch_dagster"))
    fn = app.function(gpu=gpu, image=img, timeout=int(timeout_s), serialized=True)(run_measurement)
    return app, fn


def gpu_spec(endpoint: Any) -> str:
    hw = endpoint.hardware
    return hw.gpu if hw.count == 1 else f"{hw.gpu}:{hw.count}"


def run_remote(request: dict[str, Any], *, image: str = DEFAULT_IMAGE, app_name: str = APP_NAME,
               timeout_s: int = 3600) -> dict[str, Any]:
    """``run_measurement`` on Modal: an ephemeral run of the app on the endpoint's GPUs."""
    from autoresearch_dagster.spec import EndpointSpec

    endpoint = EndpointSpec.model_validate(request["endpoint"])
    app, fn = build_app(name=app_name, image=image, gpu=gpu_spec(endpoint), timeout_s=timeout_s)
    with app.run():
        return fn.remote({**request, "engine": "sglang"})
