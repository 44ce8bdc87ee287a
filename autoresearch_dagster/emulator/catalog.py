"""Owns the emulator's catalog: named models (bundled config.json files) and GPU specs, and which model
card an endpoint's ``model`` names.

Models come from their published ``config.json`` files (``models/<name>/config.json``); an endpoint may
instead point at its own config.json (``spec.model_is_path``). GPU numbers come from the vendors'
datasheets (cited beside each entry). FLOP/s figures are *dense* (no 2:4 sparsity); memory is the
capacity the driver reports (GiB), which is what SGLang's memory-based defaults key on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from autoresearch_dagster.emulator.card import ModelCard
from autoresearch_dagster.emulator.hf_config import load_card
from autoresearch_dagster.spec import SpecError, model_is_path

GiB = 1024 ** 3


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bf16_flops: float  # dense tensor-core FLOP/s
    fp8_flops: float  # dense; equals bf16 where the GPU has no fp8 tensor cores
    hbm_bw: float  # bytes/s
    memory_gib: float  # as reported by the driver
    link_bw: float  # per-GPU interconnect bandwidth one way, bytes/s (NVLink or PCIe)
    link_latency_s: float  # latency of one small all-reduce
    has_fp8: bool = True
    # This GPU's achieved fractions relative to the ``Efficiency`` factors (1.0: as the factors say). GEMM rates
    # (dense and MoE; attention kernels keep ``attn_mfu``) and HBM streaming do not reach the same share of their datasheet peaks on every
    # part: a 700 W H100 SXM runs sustained GEMMs at a power-limited clock (on the same die, an H200 holds about
    # 1.45 GHz of its 1.98 GHz boost: ml-engineering's MSMF 703 of 989 TFLOP/s), while an A100's HBM2e streams
    # closer to its peak. Fitted per GPU on the validation table's fit half (``emulator.validation.fit``, parameters
    # ``gpu.<name>.mfu_scale`` / ``gpu.<name>.mbu_scale``) relative to the A100, the reference (1.0), as is every
    # GPU the table has no runs of.
    mfu_scale: float = 1.0
    mbu_scale: float = 1.0

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GiB


MODELS_DIR = Path(__file__).parent / "models"
# Each named model is its published config.json (meta-llama/Llama-3.1-8B-Instruct, Qwen/Qwen2.5-32B-Instruct,
# Qwen/Qwen3-235B-A22B, google/gemma-4-26b-a4b-it; the fields the derivation reads, as on the Hub), bundled
# as package data and derived through the same path as a user's own file (``hf_config.load_card``).
# The Hub is not reachable from where these were added; the later ones are copies of the Hub files kept in
# ai-dynamo/aiconfigurator (aic-core/src/aiconfigurator_core/model_configs/, commit 095f58a5), checked against
# independent sources: deepseek-v3.2 (deepseek-ai--DeepSeek-V3.2_config.json; DeepSeek's own
# inference/config_671B_v3.2.json agrees), qwen3.5-35b-a3b (Qwen--Qwen3.5-35B-A3B_config.json; cudnn-frontend's
# benchmark table and sglang-jax issue 1251 agree), glm-5.2 (zai-org--GLM-5.2_config.json; NVIDIA's NVFP4 copy
# agrees). qwen3.5-9b is assembled from the fields third parties quote from its config.json (cudnn-frontend's
# benchmark/e2e/_qwen_configs.py among them) in the 27B file's layout; its derived parameter counts match the
# checkpoint's counted tensors (tests/emulator/test_hf_config.py). qwen2-7b (Qwen/Qwen2-7B-Instruct, for the
# knob-effect pairs) is the Qwen2Config transformers printed for that checkpoint in a public issue (the module tree
# printed beside it has the same shapes: 3584 / 512 / 18944 / 152064); a LLaVA test that writes the checkpoint's
# config as its backbone agrees field for field.
MODELS: dict[str, ModelCard] = {d.name: load_card(d / "config.json", name=d.name)
                                for d in sorted(MODELS_DIR.iterdir()) if (d / "config.json").is_file()}

# GPUs built on another's die take its fitted scales (the H200 is the H100's GH100 die with HBM3e): they share
# the power-limited clocks, the kernels and the host-side stack those scales absorb. Applied below the catalog, and
# by ``validation.gpus_with`` to a fit's scales.
SAME_DIE = {"H200": "H100"}

GPUS: dict[str, GPUSpec] = {g.name: g for g in [
    # NVIDIA H100 SXM5 datasheet: 989 TFLOPS bf16 dense, 1979 fp8 dense, 3.35 TB/s HBM3, 80 GB,
    # NVLink 4 900 GB/s (bidirectional; 450 GB/s each way).
    GPUSpec("H100", bf16_flops=989e12, fp8_flops=1979e12, hbm_bw=3.35e12, memory_gib=79.6,
            link_bw=450e9, link_latency_s=8e-6, mfu_scale=0.480, mbu_scale=1.155),
    # NVIDIA H200 SXM datasheet: H100 compute, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s. The H100's scales
    # (SAME_DIE): the table has no H200 run in its fit half.
    GPUSpec("H200", bf16_flops=989e12, fp8_flops=1979e12, hbm_bw=4.8e12, memory_gib=139.8,
            link_bw=450e9, link_latency_s=8e-6),
    # NVIDIA HGX B200 datasheet (per GPU): 2.25 PFLOPS bf16 dense, 4.5 PFLOPS fp8 dense, 8 TB/s HBM3e,
    # 180 GB, NVLink 5 1.8 TB/s (900 GB/s each way).
    GPUSpec("B200", bf16_flops=2250e12, fp8_flops=4500e12, hbm_bw=8.0e12, memory_gib=178.4,
            link_bw=900e9, link_latency_s=6e-6),
    # NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS bf16 dense, no fp8 tensor cores (fp8 weights run as
    # weight-only w8a16: bytes halve, FLOP/s do not), 2.04 TB/s HBM2e, NVLink 3 600 GB/s.
    GPUSpec("A100", bf16_flops=312e12, fp8_flops=312e12, hbm_bw=2.039e12, memory_gib=79.2,
            link_bw=300e9, link_latency_s=10e-6, has_fp8=False),
    # NVIDIA L40S datasheet: 362 TFLOPS bf16 dense (733 sparse), 733 TFLOPS fp8 dense, 864 GB/s
    # GDDR6, 48 GB, no NVLink: PCIe Gen4 x16 64 GB/s (32 GB/s each way).
    GPUSpec("L40S", bf16_flops=362e12, fp8_flops=733e12, hbm_bw=0.864e12, memory_gib=44.5,
            link_bw=32e9, link_latency_s=25e-6),
    # This machine's CPU as a device (issue 14, ground truth against vLLM on CPU): 2 cores of a Sapphire Rapids
    # Xeon (AMX bf16 tiles, AVX-512 bf16), measured with benchmarks/bench_cpu_peak.py (torch bf16 GEMM on 2
    # threads on an idle machine: 2.04-2.12 TFLOP/s at n=2048 in three runs; a 1 GiB copy: 24.9-25.5 GB/s
    # read+write; we record 2.07e12 and 25.2e9; a run beside the test suite gave 0.79 and 13.5, so measure
    # it idle). Measured, not datasheet peaks: the cost model's efficiency factors then scale what
    # this machine actually reaches. No fp8 matmul units (fp8 weights run as weight-only). Memory: the
    # machine's 23 GiB RAM; a single device, so the link figures only matter for tp > 1 (shared memory).
    GPUSpec("CPU-SPR-2C", bf16_flops=2.07e12, fp8_flops=2.07e12, hbm_bw=25.2e9, memory_gib=23.0,
            link_bw=10e9, link_latency_s=20e-6, has_fp8=False),
]}
GPUS.update({g: replace(GPUS[g], mfu_scale=GPUS[src].mfu_scale, mbu_scale=GPUS[src].mbu_scale)
             for g, src in SAME_DIE.items()})
BASE_GPUS: dict[str, GPUSpec] = dict(GPUS)  # the catalog before any device fit: what a fit starts from

# Numbers fitted to a device probe of the GPU itself (``autoresearch emulator fit-device``, from the JSON that
# benchmarks/device/probe_gpu.py writes on that GPU): per GPU, the GPUSpec fields the fit changed, applied over
# BASE_GPUS (so a GPU probed on its own no longer takes a same-die sibling's scales). Absent until a probe is fitted.
DEVICE_FITS_FILE = Path(__file__).parent / "device_fits.json"
_SPEC_NUMBERS = frozenset(f.name for f in fields(GPUSpec) if f.type in ("float", float))


def read_device_fits(path: str | Path) -> dict[str, dict[str, float]]:
    """The GPUSpec numbers a device-fits file sets, per catalog GPU (``{"H100": {"mfu_scale": 0.47}}``)."""
    p = Path(path)
    try:
        data: Any = json.loads(p.read_text())
        entries = data["gpus"]
        out = {str(g).upper(): {k: float(v) for k, v in e["spec"].items()} for g, e in entries.items()}
    except FileNotFoundError:
        raise SpecError(f"device fits file {p} does not exist") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SpecError(f"device fits file {p} is not a device-fits JSON ({{'gpus': {{NAME: {{'spec': ...}}}}}}): "
                        f"{e!r}") from None
    for g, spec in out.items():
        if g not in BASE_GPUS:
            raise SpecError(f"device fits file {p}: unknown GPU {g!r}; known GPUs: {', '.join(sorted(BASE_GPUS))}")
        bad = sorted(k for k, v in spec.items() if k not in _SPEC_NUMBERS or not v > 0)
        if bad:
            raise SpecError(f"device fits file {p}: {g} sets {', '.join(bad)}: not a positive GPUSpec number "
                            f"({', '.join(sorted(_SPEC_NUMBERS))})")
    return out


def gpus_with_fits(fits: dict[str, dict[str, float]]) -> dict[str, GPUSpec]:
    """BASE_GPUS with the device fits ``fits`` applied (``read_device_fits``); only the GPUs it names."""
    return {g: replace(BASE_GPUS[g], **spec) for g, spec in fits.items()}


DEVICE_FITS: dict[str, dict[str, float]] = read_device_fits(DEVICE_FITS_FILE) if DEVICE_FITS_FILE.is_file() else {}
GPUS.update(gpus_with_fits(DEVICE_FITS))


def model_card(name: str) -> ModelCard:
    """A catalog model's card, or the card of the config.json a path names (``spec.model_is_path``; a relative
    path is read against the working directory: ``spec.load_endpoint`` has made an endpoint's absolute)."""
    if model_is_path(name):
        return load_card(name)
    try:
        return MODELS[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r} for the emulator; known models: {', '.join(sorted(MODELS))}, "
                        f"or a path to a Hugging Face config.json (./my-model/config.json)") from None


def model_traits(name: str) -> frozenset[str]:
    """``ModelCard.traits`` of a catalog model or config.json path; none for a model the emulator does not know
    (a real endpoint's model named only by its serving name: its model-specific knobs are then not searched)."""
    try:
        return model_card(name).traits
    except SpecError:
        return frozenset()


def gpu(name: str) -> GPUSpec:
    try:
        return GPUS[name.upper()]
    except KeyError:
        raise SpecError(f"unknown GPU {name!r} for the emulator; known GPUs: {', '.join(sorted(GPUS))}") from None
