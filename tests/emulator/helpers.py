"""Shared helpers for the emulator tests: small engines, workloads and a fast capacity search."""
from __future__ import annotations

from autoresearch_dagster.emulator.catalog import gpu, model_card
from autoresearch_dagster.emulator.core import EmuRequest, EngineCore
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.workloads import WorkloadShape, synthetic_pool
from autoresearch_dagster.engines.emulator import EmulatorEngine
from autoresearch_dagster.measure.capacity import find_capacity
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.spec import SLA, EndpointSpec

QUIET = NoiseSettings.off()
FAST = CapacitySettings(step_duration_s=40, min_completed=30, start_rps=1.0, growth=2.0, resolution=0.05,
                        warmup_s=0, max_steps=14, request_timeout_s=120)


def endpoint(model: str = "gemma-moe-26b-a4b", gpu_name: str = "H200", count: int = 1,
             sla: str = "ttft_p99<=3000ms,tpot_p99<=60ms") -> EndpointSpec:
    return EndpointSpec(name="t", model=model, hardware={"gpu": gpu_name, "count": count}, sla=sla)


def core(config: dict | None = None, *, model: str = "gemma-moe-26b-a4b", gpu_name: str = "H200", gpus: int = 1,
         seed: int = 0, noise: NoiseSettings | None = QUIET) -> EngineCore:
    return EngineCore(model_card(model), gpu(gpu_name), gpus, config or {}, seed=seed, noise=noise)


def reqs(n: int, prompt: int, output: int, *, start: float = 0.0, every: float = 0.0, prefix: str = "u",
         shared_blocks: int = 0, bt: int = 64) -> list[EmuRequest]:
    out = []
    for i in range(n):
        hashes = [hash(("shared", b)) for b in range(shared_blocks)]
        hashes += [hash((prefix, i, b)) for b in range(shared_blocks, prompt // bt)]
        out.append(EmuRequest(f"{prefix}{i}", prompt, output, hashes, bt, start + i * every))
    return out


def capacity(config: dict, pool, *, sla: str, model: str = "gemma-moe-26b-a4b", gpu_name: str = "H200",
             count: int = 1, seed: int = 0, noise: NoiseSettings | None = QUIET,
             settings: CapacitySettings = FAST):
    ep = endpoint(model, gpu_name, count, sla)
    dep = EmulatorEngine(ep, noise=noise).deploy(config, seed=seed)
    return find_capacity(dep, pool, SLA.parse(sla), gpus=count, model=model, settings=settings, seed=seed)


def pool(**kw):
    seed = kw.pop("seed", 0)
    return synthetic_pool(WorkloadShape(**kw), seed=seed)
