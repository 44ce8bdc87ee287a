"""Owns how the emulator sees an endpoint whose engine it does not model natively (vLLM).

The emulator models an SGLang server: its inputs are SGLang's knobs, a catalog device and a model card.
``emulator_view(endpoint, config)`` turns any endpoint and server config into those inputs, so that one
surrogate, one calibration and one pre-screen serve every engine. SGLang-flavoured endpoints (emulator,
sglang, modal, external) pass through unchanged. A vLLM endpoint is mapped:

- model: the served model directory's ``config.json`` (``engine_options.model_path``, else ``model``;
  relative to the spec file), read as a model card (``emulator.hf_config``);
- device: ``engine_options.emulator_device`` (a catalog name, e.g. ``CPU-SPR-2C`` for this machine's two
  cores, measured by benchmarks/bench_cpu_peak.py), else ``hardware.gpu`` when the catalog has it;
- knobs, each to what the emulator implements of the same mechanism:
  max_num_seqs -> max_running_requests; max_num_batched_tokens -> chunked_prefill_size (vLLM V1's token
  budget per step, prefill chunks and decodes together: hence ``enable_mixed_chunk``; its scheduling is
  synchronous, ``async_scheduling`` false: hence ``disable_overlap_schedule``); enable_chunked_prefill
  false -> chunked_prefill_size -1; enable_prefix_caching false -> disable_radix_cache; block_size ->
  page_size; kv_cache_dtype fp8* -> the same fp8 format; enforce_eager -> disable_cuda_graph (always on a
  CPU device: the CPU backend captures no graphs); stream_interval as is; tensor_parallel_size -> tp_size;
  the engine option ``kv_cache_gb`` (vLLM's CPU KV space) -> mem_fraction_static ((KV GiB + weights) /
  device memory, at least the knob's floor 0.05);
- defaults the two engines do not share: where the config leaves them unset, vLLM 0.32's CPU defaults as
  its /server_info reports them here (max_num_seqs 128, max_num_batched_tokens 2048) on a CPU device;
  on a GPU device vLLM's GPU defaults (``vllm_gpu_defaults``: ``EngineArgs._set_default_max_num_seqs_and_
  batched_tokens_args`` keys the API server's max_num_seqs / max_num_batched_tokens on device memory and
  name, 1024 / 8192 on H100-class parts, 256 / 2048 on an A100 (vLLM PR #17885) and smaller parts, 1024 /
  16384 from 160 GiB; the KV cache gets ``gpu_memory_utilization`` (0.9 up to vLLM 0.11) of the device less
  the weights and the profiled activation peak, where SGLang keeps a fixed reserve);
- not modelled, listed in ``EmulatorView.not_modelled``: long_prefill_token_threshold, dtype,
  scheduling_policy (priority without per-request priorities is fcfs), max_model_len (the card's own
  context limit applies). The CPU backend's own costs (a Python scheduler step, no graphs) are what the
  efficiency factors ``step_overhead_s``/``per_req_overhead_s`` stand for, fitted by calibration.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoresearch_dagster.spec import EndpointSpec, SpecError, validate_server_config

if TYPE_CHECKING:
    from autoresearch_dagster.emulator.card import ModelCard
    from autoresearch_dagster.emulator.catalog import GPUSpec

# vLLM 0.32.0's resolved defaults on the CPU backend (/server_info of the tiny Llama here: max_num_seqs 128,
# max_num_batched_tokens 2048, block_size 128)
VLLM_CPU_DEFAULTS = {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "block_size": 128}
NOT_MODELLED = ("long_prefill_token_threshold", "dtype", "scheduling_policy", "max_model_len")


@dataclass(frozen=True)
class EmulatorView:
    endpoint: EndpointSpec  # engine "emulator": catalog device, model card (a name or a config.json path)
    config: dict[str, Any]  # SGLang's knobs, as the emulator reads them
    not_modelled: list[str] = field(default_factory=list)  # the endpoint engine's knobs passed over


def is_cpu_device(name: str) -> bool:
    return name.upper().startswith("CPU-")


def model_config_path(endpoint: EndpointSpec) -> Path:
    """The config.json of a vLLM endpoint's served model directory (absolute)."""
    raw = Path(str(endpoint.engine_options.get("model_path") or endpoint.model)).expanduser()
    if not raw.is_absolute() and endpoint.source_path:
        raw = Path(endpoint.source_path).parent / raw
    path = raw if raw.name.endswith(".json") else raw / "config.json"
    if not path.is_file():
        raise SpecError(f"endpoint {endpoint.name!r}: the emulator needs the model's config.json, {path} is not there "
                        "(set engine_options.model_path to the model directory)")
    return path.resolve()


def emulator_device(endpoint: EndpointSpec) -> str:
    from autoresearch_dagster.emulator.catalog import GPUS

    name = str(endpoint.engine_options.get("emulator_device") or endpoint.hardware.gpu)
    if name not in GPUS:
        raise SpecError(f"endpoint {endpoint.name!r}: no catalog device {name!r} to emulate it on; set "
                        f"engine_options.emulator_device to one of {', '.join(sorted(GPUS))}")
    return name


def portable(endpoint: EndpointSpec) -> EndpointSpec:
    """``endpoint`` with what its view reads from files named absolutely (a vLLM endpoint's model directory), so it
    survives serialization to a worker process (``source_path`` does not)."""
    if endpoint.engine != "vllm":
        return endpoint
    opts = {**endpoint.engine_options, "model_path": str(model_config_path(endpoint).parent)}
    return endpoint.model_copy(update={"engine_options": opts})


def emulator_view(endpoint: EndpointSpec, config: dict[str, Any]) -> EmulatorView:
    """The emulator's endpoint and SGLang config for ``config`` on ``endpoint`` (see the module docstring)."""
    if endpoint.engine != "vllm":
        return EmulatorView(endpoint, validate_server_config(config), [])
    return _vllm_view(endpoint, validate_server_config(config, "vllm"))


# vLLM turned async scheduling on by default (vllm-project/vllm#27614, the last item of the async-scheduling plan
# #27679, finished around the turn of 2025; GPUStack's Qwen3.5 page drops --async-scheduling from its vLLM 0.17.1
# commands as on by default). Versions from this one schedule asynchronously unless told otherwise. 0.14.0 is the
# release we remember announcing it; not verified against release notes here (none are reachable), so the
# validation table's one vLLM 0.13.0 page runs synchronously on that memory alone.
VLLM_ASYNC_DEFAULT_FROM = (0, 14)


def vllm_async_by_default(version: str) -> bool:
    """Whether a vLLM release schedules asynchronously by default (``VLLM_ASYNC_DEFAULT_FROM``)."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= VLLM_ASYNC_DEFAULT_FROM


VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default through 0.11 (CacheConfig.gpu_memory_utilization; 0.92 in 0.32)
VLLM_NON_TORCH_GIB = 0.5  # CUDA context and NCCL buffers, outside the profiled torch peak


def vllm_gpu_defaults(card: ModelCard, dev: GPUSpec, *, tp: int = 1, max_num_seqs: int | None = None,
                      max_num_batched_tokens: int | None = None, gpu_memory_utilization: float | None = None,
                      fp8_weights: bool = False, async_scheduling: bool = False) -> dict[str, Any]:
    """SGLang knobs for a vLLM server on a GPU with these (else vLLM's default) settings: the per-device
    max_num_seqs / max_num_batched_tokens defaults of vLLM's API server, one token-budgeted step for prefill
    chunks and decodes (mixed chunk), synchronous scheduling unless ``async_scheduling`` (opt-in through 0.11, the
    default later: ``vllm_async_by_default``; it overlaps scheduling with the forward pass as SGLang's overlap
    scheduler does), and the KV pool vLLM's
    memory profiling leaves: utilization x device memory - weights - the activation peak of a
    max_num_batched_tokens forward pass (hidden states, QKV, gate/up and activation outputs in bf16) - non-torch
    memory, expressed as SGLang's mem_fraction_static ((KV + weights) / device memory)."""
    from autoresearch_dagster.emulator.catalog import GiB

    mem = dev.memory_gib * GiB
    if dev.memory_gib >= 160:
        seqs, budget = 1024, 16384
    elif dev.memory_gib >= 70 and dev.name.upper() != "A100":
        seqs, budget = 1024, 8192
    else:
        seqs, budget = 256, 2048
    seqs = int(max_num_seqs or seqs)
    budget = int(max_num_batched_tokens or budget)
    util = float(gpu_memory_utilization or VLLM_GPU_MEMORY_UTILIZATION)
    ffn = card.ffn or card.expert_ffn * card.active_experts + card.shared_ffn
    activation = budget * (6 * card.hidden + 3 * ffn) * 2.0 / tp
    weights = card.weights_bytes(fp8_weights) / tp
    kv = util * mem - weights - activation - VLLM_NON_TORCH_GIB * GiB
    frac = (kv + weights) / mem
    out = {"enable_mixed_chunk": True, "disable_overlap_schedule": not async_scheduling, "max_running_requests": seqs,
           "chunked_prefill_size": budget, "mem_fraction_static": round(min(0.99, max(0.05, frac)), 6)}
    if card.linear_layers:  # vLLM leaves prefix caching off for hybrid (Mamba-style) models unless asked (GPUStack's
        # vLLM 0.17.1 Qwen3.5 pages try --enable-prefix-caching as an option), so nothing stops async scheduling
        out["disable_radix_cache"] = True
    return out


def _vllm_view(endpoint: EndpointSpec, config: dict[str, Any]) -> EmulatorView:
    from autoresearch_dagster.emulator.catalog import GiB, gpu
    from autoresearch_dagster.emulator.hf_config import load_card

    model = model_config_path(endpoint)
    device = emulator_device(endpoint)
    dev, card = gpu(device), load_card(str(model))
    cpu = is_cpu_device(device)
    c = {**(VLLM_CPU_DEFAULTS if cpu else {}), **{k: v for k, v in config.items() if v is not None}}
    # vLLM 0.32 schedules synchronously (async_scheduling false in its resolved config): no CPU work hides behind
    # the forward pass, unlike SGLang's overlap scheduler
    out: dict[str, Any] = {"enable_mixed_chunk": True, "disable_overlap_schedule": True} if cpu else vllm_gpu_defaults(
        card, dev, tp=int(c.get("tensor_parallel_size") or 1), fp8_weights=card.quantization == "fp8")
    if "max_num_seqs" in c:
        out["max_running_requests"] = c["max_num_seqs"]
    if c.get("enable_chunked_prefill") is False:
        out["chunked_prefill_size"] = -1
    elif "max_num_batched_tokens" in c:
        out["chunked_prefill_size"] = c["max_num_batched_tokens"]
    if c.get("enable_prefix_caching") is False:
        out["disable_radix_cache"] = True
    if "block_size" in c:
        out["page_size"] = min(int(c["block_size"]), 256)
    if str(c.get("kv_cache_dtype", "auto")).startswith("fp8"):
        out["kv_cache_dtype"] = "fp8_e5m2" if c["kv_cache_dtype"] == "fp8_e5m2" else "fp8_e4m3"
    if cpu or c.get("enforce_eager"):
        out["disable_cuda_graph"] = True
    if "stream_interval" in c:
        out["stream_interval"] = c["stream_interval"]
    if int(c.get("tensor_parallel_size") or 1) > 1:
        out["tp_size"] = int(c["tensor_parallel_size"])
    if "kv_cache_gb" in endpoint.engine_options:
        kv = float(endpoint.engine_options["kv_cache_gb"]) * GiB
        out["mem_fraction_static"] = min(0.99, max(0.05, round((kv + card.weights_bytes(False)) / (dev.memory_gib * GiB), 6)))
    emu = endpoint.model_copy(update={"engine": "emulator", "model": str(model),
                                      "hardware": endpoint.hardware.model_copy(update={"gpu": device}),
                                      "server_config": validate_server_config(out), "engine_options": {}})
    return EmulatorView(emu, emu.server_config, sorted(k for k in config if k in NOT_MODELLED))
