"""Owns `autoresearch emulator fit-device`: a GPU's catalog numbers from a device probe run on that GPU.

Reads the JSON ``benchmarks/device/probe_gpu.py`` wrote, fits the GPU's numbers (``emulator.device_fit``), prints
them before and after with the measured and prior fractions behind each, and writes the GPU's entry into the
device-fits file atomically: by default the one the catalog loads (``catalog.DEVICE_FITS_FILE``), so every later
emulator run on that GPU prices its steps with them. Registered by ``cli/emulator.py``.
"""
from __future__ import annotations

import argparse
from typing import Any

from autoresearch_dagster.spec import SpecError


def register_fit_device(sub: Any) -> None:
    from autoresearch_dagster.emulator.catalog import DEVICE_FITS_FILE

    sp = sub.add_parser(
        "fit-device", help="fit a GPU's catalog numbers (GEMM and HBM scales, fp8 peak) to a device probe",
        description="Fit a catalog GPU's numbers to the JSON of benchmarks/device/probe_gpu.py run on that GPU: "
                    "its GEMM scale moves by the probed bf16 fraction of the datasheet peak over the published "
                    "maximum-achievable fraction, the fp8 peak and HBM scale likewise where a prior exists. Prints "
                    "old and new numbers and writes the GPU's entry into the device-fits file.")
    sp.add_argument("--probe", required=True, help="probe JSON (benchmarks/device/probe_gpu.py --out FILE)")
    sp.add_argument("--gpu", help="catalog GPU the probe ran on (default: the one the probe's device name names)")
    sp.add_argument("--out", default=str(DEVICE_FITS_FILE),
                    help=f"device-fits file to update (default {DEVICE_FITS_FILE}: the one the catalog loads)")
    for kind in ("bf16", "fp8", "hbm"):
        sp.add_argument(f"--{kind}-prior", type=float,
                        help=f"achieved {kind} fraction of the datasheet peak expected of this GPU (default: the "
                             f"published one, emulator.device_fit.PRIORS)")
    sp.add_argument("--allow-tiny", action="store_true",
                    help="accept a --tiny probe (its small shapes do not measure the device; for tests)")
    sp.set_defaults(func=_fit_device)


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


def _fit_device(args: argparse.Namespace) -> int:
    from autoresearch_dagster.emulator.device_fit import fit_device, gpu_of_probe, load_probe, write_fit

    probe = load_probe(args.probe)
    if probe.get("tiny") and not args.allow_tiny:
        raise SpecError(f"{args.probe} is a --tiny probe: its small shapes do not measure the device; run the full "
                        f"probe (or pass --allow-tiny)")
    gpu = (args.gpu or gpu_of_probe(probe)).upper()
    dev = str(probe["device"].get("name", ""))
    priors = {k: v for k in ("bf16", "fp8", "hbm") if (v := getattr(args, f"{k}_prior")) is not None}
    fit = fit_device(probe, gpu, priors=priors, source=str(args.probe))
    print(f"{gpu} from probe of {dev!r} ({probe['device'].get('type')}, torch {probe.get('torch')}, "
          f"{probe.get('timestamp')})")
    if gpu.replace("-", "") not in dev.upper().replace(" ", "").replace("-", ""):
        print(f"  note: the probe's device name does not name {gpu}")
    for kind, f in fit.fractions.items():
        print(f"  {kind:5s} measured fraction of the catalog peak {_fmt(f['measured'])}  prior {_fmt(f['prior'])}  "
              f"ratio {_fmt(f['ratio'])}")
    for k, new in fit.spec.items():
        old = fit.base[k]
        print(f"  {k:10s} {_fmt(old)} -> {_fmt(new)}  (x{new / old:.3f})")
    r = fit.recorded
    print(f"  recorded: launch {_fmt(r['launch_us'])} us (graph {_fmt(r['graph_launch_us'])} us), attention decode "
          f"{_fmt(r['attn_decode_s_per_ctx_token'])} s per token of context, prefill "
          f"{_fmt(r['attn_prefill_tflops'])} TFLOP/s; {r['why']}")
    for n in fit.notes:
        print(f"  note: {n}")
    print(f"wrote {write_fit(fit, args.out)}")
    return 0
