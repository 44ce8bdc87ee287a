"""The device probe runs (tiny shapes, on this CPU) and writes the schema the fitter reads; ``fit-device`` moves a
GPU's catalog numbers the way the probe's figures say, writes a file the catalog loads, and the cost model prices
steps on the fitted GPU differently."""
import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch_dagster.cli import main
from autoresearch_dagster.emulator import catalog, cost, device_fit
from autoresearch_dagster.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "benchmarks" / "device" / "probe_gpu.py"


@pytest.fixture(scope="module")
def tiny_probe(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("probe") / "probe.json"
    subprocess.run([sys.executable, str(PROBE), "--tiny", "--device", "cpu", "--out", str(out), "--budget-s", "60"],
                   check=True, timeout=120, cwd=ROOT, capture_output=True)
    return out


def _strict(text: str):
    def no_constant(name):
        raise AssertionError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=no_constant)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def test_tiny_probe_on_cpu_writes_the_schema(tiny_probe):
    data = _strict(tiny_probe.read_text())
    assert data["schema"] == device_fit.PROBE_SCHEMA and data["tiny"] is True
    assert data["device"]["type"] == "cpu" and data["device"]["name"] and data["torch"]
    assert "T" in data["timestamp"] and data["elapsed_s"] < 60
    kinds = {(m["kind"], m.get("phase") or m.get("op") or m.get("mode"), m["dtype"]) for m in data["measurements"]}
    assert {("gemm", "decode", "bf16"), ("gemm", "prefill", "bf16"), ("attention", "decode", "bf16"),
            ("attention", "prefill", "bf16"), ("memory", "copy", "bf16"), ("memory", "read", "fp32"),
            ("launch", "eager", "fp32")} <= kinds
    for m in data["measurements"]:
        assert isinstance(m["shape"], dict) and _positive(m["seconds"]), m
        derived = [m[k] for k in ("tflops", "gbs", "us_per_launch") if k in m]
        assert derived and all(_positive(v) for v in derived), m
    gemm = next(m for m in data["measurements"] if m["kind"] == "gemm")
    assert math.isclose(gemm["tflops"], 2 * gemm["shape"]["m"] * gemm["shape"]["k"] * gemm["shape"]["n"]
                        / gemm["seconds"] / 1e12)
    # no fp8 tensor cores on a CPU: skipped, with the reason, and no fp8 figure in the summary
    assert any("fp8" in s["what"] and "CPU" in s["reason"] for s in data["skipped"])
    s = data["summary"]
    assert s["fp8_tflops"] is None and s["graph_launch_us"] is None
    for k in ("bf16_tflops", "memory_bw_gbs", "read_bw_gbs", "launch_us", "attn_decode_s_per_ctx_token",
              "attn_prefill_tflops", "decode_gemm_bf16_gbs"):
        assert _positive(s[k]), k
    assert s["bf16_tflops"] == max(m["tflops"] for m in data["measurements"]
                                   if m["kind"] == "gemm" and m["phase"] == "prefill")
    device_fit.load_probe(tiny_probe)  # the fitter accepts it


def test_probe_budget_stops_and_lists_what_it_skipped(tmp_path):
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, str(PROBE), "--tiny", "--device", "cpu", "--out", str(out), "--budget-s", "0"],
                   check=True, timeout=120, cwd=ROOT, capture_output=True)
    data = _strict(out.read_text())
    assert data["measurements"] == [] and any("budget" in s["reason"] for s in data["skipped"])


def _fits(path: Path) -> dict:
    return _strict(path.read_text())["gpus"]


def test_fit_device_on_the_cpu_probe_moves_the_cpu_device_and_the_emulator_runs_on_it(tiny_probe, tmp_path, capsys):
    out = tmp_path / "fits.json"
    assert main(["emulator", "fit-device", "--probe", str(tiny_probe), "--gpu", "CPU-SPR-2C",
                 "--out", str(out), "--allow-tiny"]) == 0
    printed = capsys.readouterr().out
    assert "mfu_scale" in printed and "->" in printed and str(out) in printed
    summary = _strict(tiny_probe.read_text())["summary"]
    base = catalog.BASE_GPUS["CPU-SPR-2C"]
    entry = _fits(out)["CPU-SPR-2C"]
    # the CPU device's catalog figures are measurements (prior 1.0): the scales become probed / catalog figure
    assert math.isclose(entry["spec"]["mfu_scale"], base.mfu_scale * summary["bf16_tflops"] * 1e12 / base.bf16_flops)
    assert math.isclose(entry["spec"]["mbu_scale"], base.mbu_scale * summary["memory_bw_gbs"] * 1e9 / base.hbm_bw)
    assert (entry["spec"]["mfu_scale"] < base.mfu_scale) == (summary["bf16_tflops"] * 1e12 < base.bf16_flops)
    fitted = catalog.gpus_with_fits(catalog.read_device_fits(out))["CPU-SPR-2C"]
    card = catalog.model_card("llama-3.1-8b")

    def prefill(hw):
        return cost.CostModel(card, hw, tp=1, fp8_weights=False, kv_bytes=2).step(prefill_tokens=2048, prefill_seqs=1)

    before, after = prefill(catalog.gpu("CPU-SPR-2C")), prefill(fitted)
    assert after.gemm_s != before.gemm_s
    assert (after.gemm_s > before.gemm_s) == (fitted.mfu_scale < base.mfu_scale)


def _h100_probe(tiny_probe: Path, tmp_path: Path, **summary) -> Path:
    data = copy.deepcopy(_strict(tiny_probe.read_text()))
    data["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}
    data["tiny"] = False
    data["summary"].update(summary)
    p = tmp_path / "h100.json"
    p.write_text(json.dumps(data))
    return p


def test_fit_device_h100_applies_the_ratio_to_the_published_prior(tiny_probe, tmp_path):
    h100 = catalog.BASE_GPUS["H100"]
    prior = device_fit.PRIORS["H100"]
    # bf16 at half the published achievable fraction, fp8 right at it, copy bandwidth 3.0 TB/s
    probe = _h100_probe(tiny_probe, tmp_path, bf16_tflops=0.5 * prior["bf16"] * 989, fp8_tflops=prior["fp8"] * 1979,
                        memory_bw_gbs=3000.0)
    out = tmp_path / "fits.json"
    assert main(["emulator", "fit-device", "--probe", str(probe), "--out", str(out)]) == 0  # the name names H100
    spec = _fits(out)["H100"]["spec"]
    assert math.isclose(spec["mfu_scale"], 0.5 * h100.mfu_scale)
    # fp8 GEMMs run at fp8_flops x mfu_scale: a probe at the fp8 prior leaves that rate where it was
    assert math.isclose(spec["fp8_flops"] * spec["mfu_scale"], h100.fp8_flops * h100.mfu_scale)
    assert "mbu_scale" not in spec  # no published HBM prior: recorded, not applied
    assert any(n.startswith("hbm") for n in _fits(out)["H100"]["notes"])

    fitted = catalog.gpus_with_fits(catalog.read_device_fits(out))["H100"]
    card = catalog.model_card("llama-3.1-8b")

    def gemm_s(hw, fp8):
        cm = cost.CostModel(card, hw, tp=1, fp8_weights=fp8, kv_bytes=2)
        return cm.step(prefill_tokens=8192, prefill_seqs=1).gemm_s - cm._floor

    assert math.isclose(gemm_s(fitted, False), 2 * gemm_s(h100, False), rel_tol=1e-9)  # compute-bound prefill
    assert math.isclose(gemm_s(fitted, True), gemm_s(h100, True), rel_tol=1e-9)

    # a supplied HBM prior applies the bandwidth; refitting replaces the entry (from the base, not compounding)
    # and keeps other GPUs' entries
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"format": 1, "gpus": {"A100": {"spec": {"mfu_scale": 0.9}}}}))
    for _ in range(2):
        assert main(["emulator", "fit-device", "--probe", str(probe), "--out", str(cpu), "--hbm-prior", "0.9"]) == 0
    fits = _fits(cpu)
    assert fits["A100"]["spec"] == {"mfu_scale": 0.9}
    assert math.isclose(fits["H100"]["spec"]["mbu_scale"], h100.mbu_scale * (3000e9 / h100.hbm_bw) / 0.9)
    assert math.isclose(fits["H100"]["spec"]["mfu_scale"], 0.5 * h100.mfu_scale)


def test_fit_device_refuses_what_does_not_measure_the_device(tiny_probe, tmp_path, capsys):
    out = tmp_path / "fits.json"
    assert main(["emulator", "fit-device", "--probe", str(tiny_probe), "--gpu", "CPU-SPR-2C", "--out", str(out)]) == 2
    assert "--tiny" in capsys.readouterr().err and not out.exists()
    assert main(["emulator", "fit-device", "--probe", str(tiny_probe), "--out", str(out), "--allow-tiny"]) == 2
    assert "pass --gpu" in capsys.readouterr().err  # a CPU's name names no catalog GPU
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": device_fit.PROBE_SCHEMA, "device": {}, "summary": {"bf16_tflops": -1}}))
    with pytest.raises(SpecError, match="bf16_tflops"):
        device_fit.load_probe(bad)
    bad.write_text(json.dumps({"gpus": {"H999": {"spec": {"mfu_scale": 0.5}}}}))
    with pytest.raises(SpecError, match="unknown GPU"):
        catalog.read_device_fits(bad)
    bad.write_text(json.dumps({"gpus": {"H100": {"spec": {"has_fp8": 1.0}}}}))
    with pytest.raises(SpecError, match="has_fp8"):
        catalog.read_device_fits(bad)


def test_device_fits_change_the_cost_model_fingerprint(monkeypatch):
    now = cost.cost_model_fingerprint()
    monkeypatch.setattr(catalog, "DEVICE_FITS", {"H100": {"mfu_scale": 0.4}})
    assert cost.cost_model_fingerprint() != now
    monkeypatch.setattr(catalog, "DEVICE_FITS", {})
    assert cost.cost_model_fingerprint() == now


def test_probe_fp8_path_runs_where_scaled_mm_does(monkeypatch):
    """The fp8 GEMM code (e4m3 operands, column-major weights, per-tensor scales) runs through torch._scaled_mm;
    this torch's CPU build has it, so forcing the GPU-only gate open checks the calls before a GPU appears."""
    import importlib.util

    import torch
    spec = importlib.util.spec_from_file_location("probe_gpu", PROBE)
    probe_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe_gpu)
    try:
        torch._scaled_mm(torch.zeros(16, 16).to(torch.float8_e4m3fn), torch.zeros(16, 16).to(torch.float8_e4m3fn).t(),
                         scale_a=torch.ones(()), scale_b=torch.ones(()), out_dtype=torch.bfloat16)
    except (RuntimeError, AttributeError) as e:
        pytest.skip(f"this torch has no CPU _scaled_mm: {e}")
    monkeypatch.setattr(probe_gpu.Probe, "fp8_reason", lambda self: "")
    result = probe_gpu.run("cpu", True, 60.0)
    fp8 = [m for m in result["measurements"] if m["kind"] == "gemm" and m["dtype"] == "fp8_e4m3"]
    assert {m["phase"] for m in fp8} == {"decode", "prefill"}
    assert _positive(result["summary"]["fp8_tflops"])
    assert result["summary"]["fp8_tflops"] == max(m["tflops"] for m in fp8 if m["phase"] == "prefill")
