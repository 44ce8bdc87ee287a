"""Owns the resolution of a server config the way SGLang 0.5.23 resolves unset knobs (/server_info).

Every knob in ``spec.KNOBS`` gets a concrete value: memory-dependent defaults (chunked prefill
size, decode CUDA-graph max batch size, mem_fraction_static), the KV pool size that follows, the
max-running-requests estimate (48 under speculative decoding), speculative parameters, page size,
and ``spec.server_overrides`` (the hardware-independent rules). A hybrid linear-attention model (Qwen3-Next,
Qwen3.5) with the radix cache on runs without the overlap scheduler: SGLang's default
``mamba_scheduler_strategy`` resolves to ``no_buffer``, and ServerArgs disables the overlap schedule for
``no_buffer`` with the radix cache (``--disable-overlap-schedule``'s auto-disable list). What a value means (fp8 weights or
KV, a draft model) comes from the knob table's ``Meaning``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoresearch_dagster.emulator.catalog import GPUSpec, ModelCard
from autoresearch_dagster.emulator.cost import (
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    default_mem_fraction_static,
    kv_capacity_tokens,
    linear_state_slots,
    weight_gib,
)
from autoresearch_dagster.spec import KNOBS, SpecError, server_overrides, validate_server_config

# Per-draft-token acceptance probability by algorithm (chain drafting, top-1): EAGLE reports mean
# accepted lengths ~3-3.5 at 5 steps on chat traffic (Li et al. 2024), EAGLE-3 higher; n-gram
# lookup is workload dependent and lower on open-ended chat. NEXTN resolves to EAGLE.
ACCEPT_PROB = {"EAGLE": 0.70, "EAGLE3": 0.78, "STANDALONE": 0.65, "NGRAM": 0.45}


@dataclass(frozen=True)
class Resolved:
    knobs: dict[str, Any]  # every KNOBS name -> resolved value
    max_total_num_tokens: int  # KV pool tokens per replica
    kv_bytes: float
    fp8_weights: bool
    weight_gib: float
    spec_alpha: float  # per-draft-token acceptance probability (0 without speculative decoding)


def _is_llama(model: ModelCard) -> bool:
    return model.architecture == "LlamaForCausalLM"  # SGLang keys its speculative defaults on architectures[0]


def resolve_config(model: ModelCard, hw: GPUSpec, gpus: int, config: dict[str, Any]) -> Resolved:
    cfg = validate_server_config(config)
    k: dict[str, Any] = server_overrides({name: cfg.get(name, kn.default) for name, kn in KNOBS.items()})
    if model.linear_layers and not k["disable_radix_cache"]:
        # a hybrid linear-attention model with the radix cache runs SGLang's default mamba scheduler strategy,
        # no_buffer, and ServerArgs turns the overlap scheduler off for that pairing
        k["disable_overlap_schedule"] = True
    tp, dp = k["tp_size"], k["dp_size"]
    if tp * dp > gpus:
        raise SpecError(f"tp_size x dp_size = {tp * dp} exceeds the deployment's {gpus} GPU(s)")
    if k["chunked_prefill_size"] is None:
        k["chunked_prefill_size"] = default_chunked_prefill_size(hw)
    elif k["chunked_prefill_size"] <= 0:
        k["chunked_prefill_size"] = -1
    spec_on = k["speculative_algorithm"] is not None
    if spec_on:
        algo = k["speculative_algorithm"]
        steps, topk, draft = (5, 4, 8) if _is_llama(model) else (3, 1, 4)
        if algo == "NGRAM":
            steps, topk, draft = 11, 1, 12
        k["speculative_num_steps"] = k["speculative_num_steps"] or steps
        k["speculative_eagle_topk"] = k["speculative_eagle_topk"] or topk
        if k["speculative_eagle_topk"] == 1:
            k["speculative_num_draft_tokens"] = k["speculative_num_steps"] + 1
        else:
            k["speculative_num_draft_tokens"] = k["speculative_num_draft_tokens"] or draft
        if k["max_running_requests"] is None:
            k["max_running_requests"] = 48
    else:
        for name in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                     "speculative_draft_model_path"):
            k[name] = None
    graph_default = default_cuda_graph_max_bs(hw, tp)
    if k["cuda_graph_max_bs_decode"] is None:
        k["cuda_graph_max_bs_decode"] = graph_default
        if k["max_running_requests"] is not None:
            k["cuda_graph_max_bs_decode"] = min(graph_default, k["max_running_requests"])
    if k["mem_fraction_static"] is None:
        k["mem_fraction_static"] = default_mem_fraction_static(
            hw, chunked_prefill_size=max(k["chunked_prefill_size"], 0), tp=tp,
            cuda_graph_max_bs=k["cuda_graph_max_bs_decode"])
    if k["page_size"] is None:
        k["page_size"] = 64 if hw.name == "B200" else 1  # trtllm_mha is the SM100 default backend
    if k["prefill_decode_interval"] is None:
        k["prefill_decode_interval"] = 0
    # an fp8 checkpoint runs fp8 GEMMs without the knob (SGLang reads its quantization_config)
    fp8w = KNOBS["quantization"].meaning(k["quantization"]).fp8 is not None or model.quantization == "fp8"
    kv_bytes = 1.0 if KNOBS["kv_cache_dtype"].meaning(k["kv_cache_dtype"]).fp8 else model.kv_dtype_bytes
    draft = KNOBS["speculative_algorithm"].meaning(k["speculative_algorithm"]).draft_model
    cap = kv_capacity_tokens(model, hw, tp=tp, mem_fraction_static=k["mem_fraction_static"], fp8_weights=fp8w,
                             kv_bytes=kv_bytes, page_size=k["page_size"], draft=draft,
                             state_ratio=k["mamba_full_memory_ratio"])
    if k["max_running_requests"] is None:
        k["max_running_requests"] = int(min(max(cap / model.context_len * 512, 2048), 4096, cap // 2))
    else:
        k["max_running_requests"] = int(min(k["max_running_requests"], cap // 2))
    slots = linear_state_slots(model, hw, tp=tp, mem_fraction_static=k["mem_fraction_static"], fp8_weights=fp8w,
                               draft=draft, state_ratio=k["mamba_full_memory_ratio"])
    if slots is not None:  # a hybrid model runs at most as many requests as its state pool holds
        k["max_running_requests"] = int(min(k["max_running_requests"], slots))
    alpha = ACCEPT_PROB.get(k["speculative_algorithm"] or "", 0.0)
    return Resolved(knobs=k, max_total_num_tokens=cap, kv_bytes=kv_bytes, fp8_weights=fp8w,
                    weight_gib=weight_gib(model, tp=tp, fp8_weights=fp8w), spec_alpha=alpha)
