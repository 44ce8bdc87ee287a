"""Owns fitting a catalog GPU's numbers to a device probe: the JSON ``benchmarks/device/probe_gpu.py`` writes.

The cost model prices a GEMM at ``datasheet peak x Efficiency factor x GPUSpec.mfu_scale``, where the scale was
fitted per GPU on published serving runs (``emulator.validation``). Those runs were measured on GPUs whose kernels
reach the usual share of their datasheet peak; a probe measures what *this* GPU reaches. So a fit keeps the
published fit and corrects it by how far the probe's achieved fraction departs from the fraction such GPUs are
known to reach (the prior):

    mfu_scale_new = mfu_scale_base x (probed bf16 TFLOP/s / datasheet bf16 peak) / prior bf16 fraction

A probe that reads the prior leaves the scale as it was; a GPU that runs 10% below it (a power-capped or hot
part, an older cuBLAS) gets a 10% lower scale. The same for fp8 (the fp8 peak moves by the fp8 correction over the
bf16 one, since ``mfu_scale`` already carries the latter into fp8 GEMMs) and for HBM streaming (``mbu_scale`` by
the copy bandwidth's fraction of the datasheet bandwidth over the prior fraction). The priors are published
maximum-achievable figures (``PRIORS``); where none is published for a GPU the number is recorded, not applied,
unless the caller supplies a prior. Attention rate and launch overhead are recorded for the record: the cost
model's attention factor (``Efficiency.attn_mfu``) and per-layer launch cost (``eager_layer_s``) are shared by every
GPU, so one GPU's probe has no per-GPU number to move.

A fit always starts from ``catalog.BASE_GPUS`` (the catalog before any fit), so fitting the same probe twice gives
the same numbers; the fits file holds one entry per GPU, the latest probe's.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoresearch_dagster.emulator.catalog import BASE_GPUS, DEVICE_FITS_FILE, GPUSpec
from autoresearch_dagster.outputs.files import atomic_write_text, json_safe
from autoresearch_dagster.spec import SpecError

PROBE_SCHEMA = "autoresearch-device-probe/1"
FITS_FORMAT = 1

# Achieved fraction of the datasheet dense peak that GPUs of each kind reach on their best GEMM shapes: Stas
# Bekman's ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"
# (torch matmul, mean of 100 iterations over a shape search): bf16 A100 SXM 271.2 / 312, H100 SXM 794.5 / 989
# ("H200 is the same"), B200 SXM 1745.0 / 2250; fp8 e4m3 H100 SXM 1402.6 / 1979, H200 SXM 1453.4 / 1979, B200 SXM
# 3432.5 / 4500. No comparable table of achievable HBM bandwidth is published, so no GPU has an "hbm" prior.
# The CPU device's catalog figures are themselves measurements of the same kinds (benchmarks/bench_cpu_peak.py: a
# bf16 GEMM and a copy counted as bytes read + written), so its priors are 1.0.
PRIORS: dict[str, dict[str, float]] = {
    "A100": {"bf16": 271.2 / 312},
    "H100": {"bf16": 794.5 / 989, "fp8": 1402.6 / 1979},
    "H200": {"bf16": 794.5 / 989, "fp8": 1453.4 / 1979},
    "B200": {"bf16": 1745.0 / 2250, "fp8": 3432.5 / 4500},
    "CPU-SPR-2C": {"bf16": 1.0, "hbm": 1.0},
}
PRIOR_KINDS = ("bf16", "fp8", "hbm")
SUMMARY_KEYS = ("bf16_tflops", "fp8_tflops", "memory_bw_gbs", "read_bw_gbs", "launch_us", "graph_launch_us",
                "attn_decode_s_per_ctx_token", "attn_prefill_tflops")


def load_probe(path: str | Path) -> dict[str, Any]:
    """A probe JSON, checked: its schema, device, and a summary of finite positive figures (or null)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise SpecError(f"probe file {p} does not exist") from None
    except (ValueError, IsADirectoryError) as e:
        raise SpecError(f"probe file {p} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != PROBE_SCHEMA:
        raise SpecError(f"probe file {p} is not a device probe ({PROBE_SCHEMA}); write one with "
                        f"benchmarks/device/probe_gpu.py")
    summary = data.get("summary")
    if not isinstance(summary, dict) or not isinstance(data.get("device"), dict):
        raise SpecError(f"probe file {p} lacks its device or summary")
    for k in SUMMARY_KEYS:
        v = summary.get(k)
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise SpecError(f"probe file {p}: summary.{k} = {v!r} is not a positive number")
    if summary.get("bf16_tflops") is None:
        raise SpecError(f"probe file {p} has no bf16 GEMM figure (summary.bf16_tflops)")
    return data


def gpu_of_probe(probe: dict[str, Any]) -> str:
    """The catalog GPU a probe's device name names ("NVIDIA H100 80GB HBM3" -> H100)."""
    name = str(probe["device"].get("name", "")).upper().replace(" ", "")
    hits = [g for g in BASE_GPUS if g.replace("-", "") in name.replace("-", "")]
    if len(hits) != 1:
        raise SpecError(f"probe device {probe['device'].get('name')!r} names {'no' if not hits else 'more than one'} "
                        f"catalog GPU; pass --gpu (one of {', '.join(sorted(BASE_GPUS))})")
    return hits[0]


@dataclass
class DeviceFit:
    gpu: str
    spec: dict[str, float]  # the GPUSpec numbers the catalog applies
    base: dict[str, float]  # the same fields before (catalog.BASE_GPUS)
    fractions: dict[str, dict[str, float | None]]  # per kind: measured fraction of the datasheet, prior, applied ratio
    recorded: dict[str, Any]  # measured, not applied (and why)
    notes: list[str] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)

    def entry(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("gpu")
        return d


def fit_device(probe: dict[str, Any], gpu: str, *, priors: dict[str, float] | None = None,
               source: str = "") -> DeviceFit:
    """The numbers of catalog GPU ``gpu`` that ``probe`` implies (see the module docstring); ``priors`` (kind ->
    fraction, kinds ``PRIOR_KINDS``) replace the published ones."""
    g = gpu.upper()
    if g not in BASE_GPUS:
        raise SpecError(f"unknown GPU {gpu!r}; known GPUs: {', '.join(sorted(BASE_GPUS))}")
    base: GPUSpec = BASE_GPUS[g]
    pri = {**PRIORS.get(g, {}), **(priors or {})}
    bad = {k: v for k, v in pri.items() if k not in PRIOR_KINDS or not 0 < v <= 1.5}
    if bad:
        raise SpecError(f"priors {bad}: kinds are {', '.join(PRIOR_KINDS)}, fractions in (0, 1.5]")
    s = probe["summary"]
    spec: dict[str, float] = {}
    fractions: dict[str, dict[str, float | None]] = {}
    notes: list[str] = []

    def ratio(kind: str, measured: float | None, peak: float) -> float | None:
        frac = None if measured is None else measured / peak
        prior = pri.get(kind)
        r = frac / prior if frac is not None and prior else None
        fractions[kind] = {"measured": frac, "prior": prior, "ratio": r}
        if frac is not None and not prior:
            notes.append(f"{kind}: measured {frac:.3f} of the datasheet, recorded, not applied: no published prior "
                         f"for {g} (pass --{kind}-prior)")
        return r

    r16 = ratio("bf16", s["bf16_tflops"] * 1e12, base.bf16_flops)
    if r16 is not None:
        spec["mfu_scale"] = base.mfu_scale * r16
    fp8 = s.get("fp8_tflops")
    if base.has_fp8:
        r8 = ratio("fp8", None if fp8 is None else fp8 * 1e12, base.fp8_flops)
        if r8 is not None:
            spec["fp8_flops"] = base.fp8_flops * r8 / (r16 or 1.0)
        elif fp8 is None:
            notes.append("fp8: the probe has no fp8 GEMM figure (see its 'skipped'); fp8 numbers unchanged")
    elif fp8 is not None:
        notes.append(f"fp8: {g} has no fp8 tensor cores in the catalog (fp8 runs weight-only); the probe's "
                     f"{fp8:.4g} TFLOP/s is recorded, not applied")
    bw = s.get("memory_bw_gbs")
    rbw = ratio("hbm", None if bw is None else bw * 1e9, base.hbm_bw)
    if rbw is not None:
        spec["mbu_scale"] = base.mbu_scale * rbw
    shared = "shared by every GPU in the cost model (Efficiency), so no per-GPU number moves"
    recorded = {
        "launch_us": s.get("launch_us"), "graph_launch_us": s.get("graph_launch_us"),
        "attn_decode_s_per_ctx_token": s.get("attn_decode_s_per_ctx_token"),
        "attn_prefill_tflops": s.get("attn_prefill_tflops"),
        "attn_prefill_fraction": (s["attn_prefill_tflops"] * 1e12 / base.bf16_flops
                                  if s.get("attn_prefill_tflops") else None),
        "read_bw_gbs": s.get("read_bw_gbs"),
        "why": f"attention (attn_mfu) and launch costs (eager_layer_s, kernel_floor_s) are {shared}",
    }
    if not spec:
        raise SpecError(f"the probe moves none of {g}'s numbers: {'; '.join(notes) or 'no figure with a prior'}")
    dev = probe["device"]
    meta = {"source": source, "device": dev.get("name"), "device_type": dev.get("type"), "torch": probe.get("torch"),
            "timestamp": probe.get("timestamp"), "tiny": bool(probe.get("tiny")), "summary": s}
    return DeviceFit(g, spec, {k: float(getattr(base, k)) for k in spec}, fractions, recorded, notes, meta)


def read_fits_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        return {"format": FITS_FORMAT, "gpus": {}}
    try:
        data = json.loads(p.read_text())
    except ValueError as e:
        raise SpecError(f"device fits file {p} is not JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        raise SpecError(f"device fits file {p} is not a device-fits file (no 'gpus' object)")
    return data


def write_fit(fit: DeviceFit, path: str | Path = DEVICE_FITS_FILE) -> Path:
    """Store ``fit`` as its GPU's entry in the fits file at ``path`` (other GPUs' entries kept), atomically."""
    data = read_fits_file(path)
    entry = fit.entry()
    entry["fitted_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    data["format"] = FITS_FORMAT
    data["gpus"][fit.gpu] = entry
    data["gpus"] = dict(sorted(data["gpus"].items()))
    return atomic_write_text(path, json.dumps(json_safe(data), indent=2, sort_keys=True, allow_nan=False) + "\n")
