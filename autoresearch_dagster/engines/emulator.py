"""Owns the 'emulator' engine: the embedded SGLang emulator as an Engine, in virtual time or over HTTP.

Virtual mode: ``deploy`` builds an ``EngineCore`` and each ``run_step`` simulates the schedule in
virtual time (send offsets become arrival times), returning the same ``RequestRecord``s the HTTP
runner would measure: TTFT, the gaps between streamed chunks (honouring ``stream_interval``), E2E,
output tokens, status. The deployment's virtual clock and prefix cache persist across steps until
``flush_cache``. With an ``autoscaling`` section in the spec, each step runs on a fleet of
replicas behind a router and an autoscaler (``emulator.fleet``), fresh at every step (``min_replicas``
ready, caches empty), and ``held_s`` counts replica-seconds. HTTP mode starts the emulator's real-time server in a thread and measures it with
the runner's ``HttpDeployment``.

Hidden factors (``emulator.cost.endpoint_efficiency``): an endpoint whose spec sets
``engine_options: {hidden_factors_seed: N}`` runs on efficiency factors of its own, never reported by a
deployment; the proposers' surrogate never uses them. An endpoint whose spec sets
``engine_options: {calibration: latest}`` (or a calibration file) runs on its stored calibration
(``emulator.calibrations``). ``engine_options: {spec_acceptance: PATH | ACCEPT_LENGTH}`` replaces the
per-algorithm speculative acceptance rate with a measured one (``emulator.spec_acceptance``).
``engine_options: {release: LABEL}`` appends ``+LABEL`` to the version the engine and its deployments report,
an emulated engine upgrade (what an operator's version bump looks like to the engine_version sensor).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from typing import Any, Literal

from autoresearch_dagster.emulator.catalog import gpu, model_card
from autoresearch_dagster.emulator.core import EmuRequest, EngineCore, endpoint_version
from autoresearch_dagster.emulator.cost import Efficiency, endpoint_efficiency
from autoresearch_dagster.emulator.engine_view import VLLM_CPU_DEFAULTS, emulator_view, is_cpu_device, portable
from autoresearch_dagster.emulator.fleet import simulate_fleet
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.profile import write_profile
from autoresearch_dagster.emulator.sim import simulate
from autoresearch_dagster.emulator.spec_acceptance import acceptance_option
from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.loadgen.http_runner import HttpDeployment
from autoresearch_dagster.loadgen.records import RequestRecord, ScheduledRequest, StepOutcome
from autoresearch_dagster.spec import EndpointSpec, SpecError

STEP_GAP_S = 5.0  # virtual idle time between consecutive load steps of one deployment
class VirtualDeployment:
    """One emulated server in virtual time (implements the Deployment protocol)."""

    base_url: str | None = None

    def __init__(self, endpoint: EndpointSpec, config: dict[str, Any], *, seed: int = 0,
                 noise: NoiseSettings | None = None, efficiency: Efficiency | None = None,
                 sample_interval_s: float = 1.0):
        # an endpoint of another engine (vLLM) runs as the emulator's mapping of it (emulator.engine_view)
        view = emulator_view(endpoint, config)
        # what the endpoint's own engine was asked for (vLLM's knobs), reported back as its resolved config
        self.requested = ({**(VLLM_CPU_DEFAULTS if is_cpu_device(view.endpoint.hardware.gpu) else {}), **config}
                          if endpoint.engine == "vllm" else None)
        endpoint = view.endpoint
        self.endpoint = endpoint
        self.config = view.config
        self.acceptance = acceptance_option(endpoint.engine_options)
        self.core = EngineCore(model_card(endpoint.model), gpu(endpoint.hardware.gpu), endpoint.gpus, self.config,
                               seed=seed, noise=noise, efficiency=efficiency, acceptance=self.acceptance)
        self.seed, self.noise, self.efficiency = seed, noise, efficiency
        self.clock = 0.0  # virtual seconds since the deployment started
        self._replica_s = 0.0  # replica-seconds held by autoscaled steps
        self._steps = 0
        self.sample_interval_s = sample_interval_s
        self._profile_dir: str | None = None
        self._profile_id: str | None = None
        self._closed = False

    def run_step(self, schedule: list[ScheduledRequest], *, step_id: str, timeout_s: float) -> StepOutcome:
        if self._closed:
            raise EngineError("deployment is closed")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        base = self.clock + STEP_GAP_S
        reqs = [EmuRequest(rid=s.request_id, prompt_tokens=max(1, int(s.prompt_tokens)),
                           output_tokens=max(1, int(s.output_tokens)), block_hashes=list(s.block_hashes or []),
                           block_tokens=int(s.block_tokens or 64), arrival_s=base + float(s.send_offset_s))
                for s in schedule]
        last = max((r.arrival_s for r in reqs), default=base)
        wall0 = time.perf_counter()
        auto = self.endpoint.autoscaling
        if auto is None:
            res = simulate(self.core, reqs, sample_interval_s=self.sample_interval_s,
                           deadline_s=last + timeout_s, start_s=base)
        else:
            res = simulate_fleet(self._replica_core, reqs, auto, start_s=base, deadline_s=last + timeout_s,
                                 sample_interval_s=self.sample_interval_s)
            self._replica_s += res.replica_seconds() + STEP_GAP_S * auto.min_replicas
        self._steps += 1
        si = res.stream_interval
        by_id = {r.rid: r for r in res.requests}
        records: list[RequestRecord] = []
        for s in schedule:
            r = by_id[s.request_id]
            first = None if r.first_token_s is None else r.first_token_s - base
            end = None if r.end_s is None else r.end_s - base
            if r.status == "timeout":
                end = (last + timeout_s) - base
            records.append(RequestRecord(
                request_id=s.request_id, step_id=step_id, scheduled_s=float(s.send_offset_s),
                sent_s=float(s.send_offset_s), first_token_s=first, end_s=end,
                ttft_s=r.ttft_s, itl_s=r.itl_s(si).tolist() if r.status == "ok" else [],
                e2e_s=r.e2e_s if r.status == "ok" else None, prompt_tokens=int(s.prompt_tokens),
                output_tokens=r.output_tokens, status=r.status,
                http_status=200 if r.status == "ok" else (503 if r.status == "error" else None),
                error_class=None if r.status == "ok" else ("timeout" if r.status == "timeout" else "server_error"),
                cached_tokens=r.cached_tokens))
        self.clock = max(res.end_s, last)
        duration = max((rec.end_s or 0.0) for rec in records) if records else 0.0
        return StepOutcome(step_id=step_id, records=records, duration_s=duration,
                           engine_timeseries=res.timeseries,
                           meta={"engine": "emulator", "virtual": True, "sim_wall_s": time.perf_counter() - wall0,
                                 "send_lag_p99_ms": 0.0, "virtual_start_s": base,
                                 **({} if auto is None else {"autoscaling_events": [
                                     {**e, "t": e["t"] - base, **({"ready_s": e["ready_s"] - base} if "ready_s" in e else {})}
                                     for e in res.events]})})

    def _replica_core(self, idx: int) -> EngineCore:
        """Replica ``idx`` of the current step's fleet: a fresh server with a seed of its own."""
        seed = int(np.random.SeedSequence([self.seed, self._steps, idx]).generate_state(1)[0])
        return EngineCore(model_card(self.endpoint.model), gpu(self.endpoint.hardware.gpu), self.endpoint.gpus,
                          self.config, seed=seed, noise=self.noise, efficiency=self.efficiency,
                          acceptance=self.acceptance)

    def flush_cache(self) -> bool:
        return self.core.flush_cache()

    @property
    def held_s(self) -> float:
        """Seconds the deployment has held its GPUs: its virtual clock (virtual GPU time counts as GPU time); with
        autoscaling, replica-seconds (idle gaps between steps at ``min_replicas``), so ``held_s x GPUs`` is GPU-seconds."""
        return self.clock if self.endpoint.autoscaling is None else self._replica_s

    def server_info(self) -> dict[str, Any]:
        info = {**self.core.server_info(), "version": endpoint_version(self.endpoint), "engine": "emulator", "mode": "virtual"}
        if self.requested is not None:  # an emulated vLLM endpoint: its knobs as asked, the view beside them
            info = {"engine": "vllm", "emulated": True, "version": info["version"], "server_args": self.requested,
                    "emulator": info}
        return info

    def metrics_text(self) -> str:
        from autoresearch_dagster.emulator.prometheus import exposition, render_scalar

        labels = {"model_name": self.endpoint.model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                  "moe_ep_rank": "0"}
        return exposition([render_scalar(k, v, labels) for k, v in sorted(self.core.metrics().items())])

    def start_profile(self, output_dir: str) -> None:
        self.core.start_profile()
        self._profile_dir = output_dir
        self._profile_id = f"{self.clock:.3f}"

    def stop_profile(self) -> list[str]:
        if self._profile_dir is None:
            raise EngineError("stop_profile without start_profile")
        trace = self.core.stop_profile()
        paths = write_profile(trace, self._profile_dir, self._profile_id or "0", self.core.knobs["tp_size"])
        self._profile_dir = None
        return paths

    def close(self) -> None:
        self._closed = True


class EmulatorEngine:
    """Engine protocol over the emulator; ``mode='virtual'`` (default) or ``'http'``."""

    name = "emulator"
    restartable = True

    def __init__(self, endpoint: EndpointSpec, *, mode: Literal["virtual", "http"] = "virtual",
                 noise: NoiseSettings | None = None, efficiency: Efficiency | None = None):
        if mode not in ("virtual", "http"):
            raise SpecError(f"emulator mode must be 'virtual' or 'http', got {mode!r}")
        if mode == "http" and endpoint.autoscaling is not None:
            raise SpecError("autoscaling runs in the virtual-time emulator only (its HTTP server is one replica)")
        # another engine's endpoint (vLLM) is emulated as the emulator's view of it (emulator.engine_view)
        endpoint = portable(endpoint)
        view = emulator_view(endpoint, {}).endpoint
        model_card(view.model)
        gpu(view.hardware.gpu)
        self.endpoint, self.mode = endpoint, mode
        self.noise = noise
        from autoresearch_dagster.emulator.calibrations import calibrated_efficiency

        self.efficiency = efficiency if efficiency is not None else (
            calibrated_efficiency(endpoint) or endpoint_efficiency(endpoint.engine_options))

    def deploy(self, config: dict[str, Any], *, seed: int = 0):
        if self.mode == "virtual":
            return VirtualDeployment(self.endpoint, config, seed=seed, noise=self.noise, efficiency=self.efficiency)
        return self._deploy_http(config, seed)

    def _deploy_http(self, config: dict[str, Any], seed: int):
        from autoresearch_dagster.emulator.server import EmulatorServer, serve_in_thread

        view = emulator_view(self.endpoint, config)
        ep, config = view.endpoint, view.config
        core = EngineCore(model_card(ep.model), gpu(ep.hardware.gpu), ep.gpus,
                          config, seed=seed, noise=self.noise, efficiency=self.efficiency,
                          acceptance=acceptance_option(ep.engine_options))
        server = EmulatorServer(ep, config, seed=seed, noise=self.noise, core=core)
        return _HttpEmulatorDeployment(serve_in_thread(server), model=ep.model)

    def version(self) -> str:
        return endpoint_version(self.endpoint)

    def worker_recipe(self) -> tuple | None:
        """What a local worker process needs to rebuild this engine (``experiments.parallel``); None in
        HTTP mode, whose deployments hold sockets and threads of this process."""
        if self.mode != "virtual":
            return None
        return ("emulator", self.endpoint.model_dump_json(), self.noise, self.efficiency)


class _HttpEmulatorDeployment(HttpDeployment):
    """The runner's HTTP deployment of an emulator server this engine started; closing it stops the server."""

    def __init__(self, running: Any, *, model: str):
        super().__init__(running.base_url, model=model)
        self._running = running

    def start_profile(self, output_dir: str) -> None:
        # the server writes its traces into output_dir on this machine; stop_profile lists what is there
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        super().start_profile(output_dir)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._running.stop()
