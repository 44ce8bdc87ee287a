"""Real-engine benchmark (a start): vLLM's CPU build serving the tiny Llama, measured per vLLM config.

For each config (the endpoint's own, then each ``--config KNOB=VALUE[,KNOB=VALUE]``) it starts vLLM
through the ``vllm`` engine (``examples/real_engine/tiny-vllm-cpu.yaml``: server on core 1, runner on
core 0), runs the capacity search (``measure.capacity.find_capacity``, the CLI's path) on the demo pool
adapted to the endpoint, and prints one row: start-up seconds, capacity at the endpoint's SLA, whether
the search is valid (and why not), TTFT/TPOT p99 at capacity, steps invalid on client send lag, and the
failures by class. Beside each measured row, the emulator's prediction for the same config (issue 14):
the tiny Llama's config.json as the model card, the catalog's ``CPU-SPR-2C`` device (this machine's 2
cores, measured by benchmarks/bench_cpu_peak.py), the same pool, SLA and capacity protocol in virtual
time, with the default efficiency factors and, with ``--calibration vN.json`` (``autoresearch emulator
calibrate`` on the baseline's measured summary.json), with calibrated ones, each the median of ``--searches``
emulated searches (their range in brackets: one search's draw of sends and pool rows moves a small-slot config's
crossing by up to 2x); then predicted vs measured and whether each config moves capacity the same way as measured
(direction agreement vs the baseline). With a calibration, every measured step of every config is also replayed
on the calibrated emulator with its own sends (``emulator.calibrate.replay_measured``): SLA verdict agreement and
the error of each step's TTFT and TPOT p99, the model's error without any search's draw in it.

vLLM knobs are mapped onto the emulator's (SGLang's) inputs by ``emulator.engine_view`` (the mapping the
campaign's surrogate uses; its docstring lists what maps to what and what is not modelled). Without
``make real-engine`` it says so and exits 0; ``--measured rows.json`` (an earlier ``--out``) prints the
emulator column against those rows without starting vLLM (each row's interpolated capacity recomputed from
its summary.json's steps by today's estimator, ``measure.capacity.reinterpolate``).

``--campaign DIR`` then runs the research campaign on the real engine (``autoresearch campaign run`` on
``tiny-vllm-cpu-capped.yaml`` with ``CAMPAIGN_FLAGS``: noise floor, calibration of the emulator on it,
diagnosis, proposals pre-screened on the calibrated emulator, the experiment, the promotion's re-measured
noise floor), or resumes it, or prints the report of the finished one.

    .venv/bin/python benchmarks/bench_real_engine.py --config max_num_seqs=8     # 5-10 minutes per config
    .venv/bin/python benchmarks/bench_real_engine.py --measured out/real/rows.json --calibration vN.json \
        --campaign out/real-campaign                                            # about an hour
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoresearch_dagster.emulator import calibrations  # noqa: E402
from autoresearch_dagster.emulator.engine_view import emulator_view  # noqa: E402
from autoresearch_dagster.engines import make_engine  # noqa: E402
from autoresearch_dagster.engines.emulator import EmulatorEngine  # noqa: E402
from autoresearch_dagster.engines.vllm import vllm_python  # noqa: E402
from autoresearch_dagster.measure.capacity import find_capacity, reinterpolate  # noqa: E402
from autoresearch_dagster.measure.profiles import measurement_profile  # noqa: E402
from autoresearch_dagster.pool.adapt import AdaptedPool, limits_from_options  # noqa: E402
from autoresearch_dagster.pool.build import build_pool  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.spec import config_hash, load_endpoint, validate_server_config  # noqa: E402

SPEC = ROOT / "examples" / "real_engine" / "tiny-vllm-cpu.yaml"
CAMPAIGN_SPEC = ROOT / "examples" / "real_engine" / "tiny-vllm-cpu-capped.yaml"
# The real-engine campaign's measurement: every noise floor needs 5 runs and each run restarts vLLM (~45 s), so
# the load steps are short and the search coarse (the interpolated capacity estimator does not need a fine one);
# the 60 s timeout of the table's runs is kept at 40 s, which the capped outputs (256 tokens) never reach at the SLA.
CAMPAIGN_FLAGS = ["--concurrent-gpus", "1", "--budget-experiments", "1", "--experiments-per-round", "1",
                  "--runs-per-arm", "2", "--anchor-every", "2", "--step-duration", "10", "--min-completed", "10",
                  "--request-timeout", "40", "--max-steps", "9", "--resolution", "0.15", "--start-rps", "4",
                  "--growth", "2", "--hold-e2e-multiple", "0", "--prescreen"]


def campaign(out: Path, work: Path, lake: Path) -> int:
    """The campaign on the real engine (``autoresearch campaign run`` on the capped endpoint), unless ``out`` holds a
    finished one; prints its report."""
    import subprocess

    from autoresearch_dagster.campaign.report import format_report
    from autoresearch_dagster.pool.adapt import limits_from_options, write_adapted

    report_path = out / "campaign.json"
    if not report_path.exists():
        pool_dir = work / "pool-capped"
        if not (pool_dir / "replay_pool.parquet").exists():
            write_adapted(read_pool(work / "pool"), limits_from_options(load_endpoint(CAMPAIGN_SPEC)), pool_dir)
        cmd = [sys.executable, "-m", "autoresearch_dagster", "campaign", "run", "--endpoint", str(CAMPAIGN_SPEC),
               "--out", str(out), "--pool", str(pool_dir), "--lake", str(lake), "--memory", str(out / "memory"),
               *CAMPAIGN_FLAGS]
        print("$ " + " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        if rc != 0 or not report_path.exists():
            print(f"the campaign did not finish (exit {rc}); rerun to resume it")
            return rc or 1
    print("\n" + format_report(json.loads(report_path.read_text())))
    return 0


def predict(spec, vllm_config: dict, pool, settings, seed: int, efficiency=None, searches: int = 1) -> dict:
    """The emulator's capacity for ``vllm_config`` (its view of the vLLM endpoint, virtual time, the CLI's
    capacity search): the median of ``searches`` searches with seeds ``seed``, ``seed + 1``, ... (each search
    draws its own sends and pool rows; at a queue of a few slots one draw moves the crossing by tens of percent,
    and the prediction is of the config, not of one draw), with their range."""
    view = emulator_view(spec, vllm_config)
    caps, interps, valid = [], [], []
    for j in range(searches):
        dep = EmulatorEngine(view.endpoint, efficiency=efficiency).deploy(view.config, seed=seed + j)
        try:
            res = find_capacity(dep, pool, view.endpoint.sla, gpus=view.endpoint.gpus, model=view.endpoint.model,
                                settings=settings, seed=seed + j)
        finally:
            dep.close()
        caps.append(res.capacity_rps)
        interps.append(res.capacity_interp_rps if res.capacity_interp_rps is not None else res.capacity_rps)
        valid.append(res.valid)
    return {"capacity_rps": statistics.median(caps), "capacity_interp_rps": statistics.median(interps),
            "valid": all(valid), "searches": interps, "emulator_config": view.config, "not_modelled": view.not_modelled}


def replay_table(spec, rows: list[dict], pool, efficiency) -> None:
    """Each measured config's steps replayed on the emulator with their own sends (``replay_measured``): whether
    each step meets the SLA on both, and the error of its TTFT and TPOT p99, per config (the model's error
    without the search's draw)."""
    from autoresearch_dagster.emulator.calibrate import replay_measured
    from autoresearch_dagster.emulator.measured import read_measured

    print("\nmeasured steps replayed with their own sends (calibrated factors): SLA verdict agreement, |error| of "
          "the step's TTFT / TPOT p99 (median over steps)")
    agree_all = total_all = 0
    ttft_all: list[float] = []
    tpot_all: list[float] = []
    for r in rows:
        if not r.get("summary") or not Path(r["summary"]).exists():
            continue
        curve = read_measured(Path(r["summary"]).parent)  # the calibration's reader: arrivals inferred, its timeout
        own = sum(1 for s in curve.steps if s.get("arrival_seed") is not None)
        view = emulator_view(spec, r["config"])
        pairs = replay_measured(view.endpoint, view.config, curve.steps, pool, efficiency,
                                request_timeout_s=curve.request_timeout_s)
        agree = sum(1 for s, p in pairs if bool(s.get("passed", s.get("meets_sla"))) == p.passed)
        errs = {m: [abs(p_v / s_v - 1) for s, p in pairs
                    if (s_v := (s.get(m) or {}).get("p99")) and (p_v := getattr(p, m).get("p99")) is not None]
                for m in ("ttft_ms", "tpot_ms")}
        agree_all += agree
        total_all += len(pairs)
        ttft_all += errs["ttft_ms"]
        tpot_all += errs["tpot_ms"]
        med = {m: f"{statistics.median(v):.0%}" if v else "-" for m, v in errs.items()}
        print(f"  {json.dumps(r['config']):60s} steps {len(pairs):2d} (own sends {own:2d})  verdict agree "
              f"{agree}/{len(pairs)}  TTFT p99 {med['ttft_ms']:>4s}  TPOT p99 {med['tpot_ms']:>4s}")
    if total_all:
        print(f"  all configs: verdict agree {agree_all}/{total_all}, TTFT p99 |error| median "
              f"{statistics.median(ttft_all):.0%}, TPOT p99 |error| median {statistics.median(tpot_all):.0%}")


def cap(row: dict) -> float:
    """The capacity compared: the interpolated SLA crossing (the campaign's estimator: the search's own value is
    quantized by its steps and, near an unstable knee, by refuted confirmations), else the search's."""
    v = row.get("capacity_interp_rps")
    return float(v if v is not None else row["capacity_rps"])


def direction(x: float, base: float, tol: float = 0.05) -> int:
    """+1 / -1 when x is more than ``tol`` above / below base, else 0."""
    return 0 if abs(x / base - 1) <= tol else (1 if x > base else -1)


def parse_config(text: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        out[k.strip()] = json.loads(v) if v.strip() not in ("", "None") else None
    return validate_server_config(out, "vllm")


def measure(spec, config: dict, pool, settings, seed: int, out_dir: Path | None = None) -> dict:
    t0 = time.monotonic()
    dep = make_engine(spec).deploy(config, seed=seed)
    startup = time.monotonic() - t0
    try:
        res = find_capacity(dep, pool, spec.sla, gpus=spec.gpus, model=dep.served_model(), settings=settings, seed=seed)
        info = dep.server_info() or {}
    finally:
        dep.close()
    at = [st for st in res.steps if st.passed and abs(st.rate_rps - res.capacity_rps) < 1e-9]
    failures: dict[str, int] = {}
    for o in res.outcomes:
        for cls, f in (o.meta.get("failures") or {}).items():
            failures[cls] = failures.get(cls, 0) + f["count"]
    row = {"config": config, "startup_s": startup, "capacity_rps": res.capacity_rps,
           "capacity_interp_rps": res.capacity_interp_rps, "valid": res.valid,
           "invalid_reasons": res.invalid_reasons, "ttft_p99_ms": at[-1].ttft_ms["p99"] if at else None,
           "tpot_p99_ms": at[-1].tpot_ms["p99"] if at else None, "steps": len(res.steps),
           "lag_invalid_steps": sum(1 for st in res.steps if any("send lag" in r for r in st.invalid_reasons)),
           "failures": failures, "engine_version": info.get("version")}
    if out_dir is not None:  # the capacity layout `autoresearch emulator calibrate --measured` reads
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(
            {**res.to_dict(), "pool": str(pool.path), "pool_hash": pool.content_hash, "engine": "vllm",
             "engine_version": info.get("version"), "server_config": config, "target": str(SPEC)},
            indent=1, default=str) + "\n")
        row["summary"] = str(out_dir / "summary.json")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="a vLLM config beside the endpoint's: K=V[,K=V]")
    ap.add_argument("--step-duration", type=float, default=20.0)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--start-rps", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--searches", type=int, default=5,
                    help="emulated capacity searches per config and column (median; default 5)")
    ap.add_argument("--calibration", type=Path, help="a calibration file (v<N>.json) for the calibrated column")
    ap.add_argument("--measured", type=Path, help="rows from an earlier --out: predict against them, start no vLLM")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--campaign", type=Path, help="run (or resume, or print the finished) campaign on the real "
                                                 "engine in this directory (tiny-vllm-cpu-capped.yaml, CAMPAIGN_FLAGS)")
    ap.add_argument("--lake", type=Path, default=ROOT / "out" / "lake", help="results lake of the campaign")
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "real-engine",
                    help="the replay pool (built once, the tiny Llama's token counts) and each measured config's "
                         "summary.json (runs/TIME-HASH/, what `autoresearch emulator calibrate --measured` reads); "
                         "default out/real-engine")
    args = ap.parse_args()
    # a SIGTERM unwinds (SystemExit) so the deployment's close() stops vLLM's process group; Python's default
    # would exit at once and leave the server running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model_json = ROOT / ".real-engine" / "tiny-llama" / "config.json"
    if not model_json.exists() or (args.measured is None and vllm_python() is None):
        print("bench_real_engine: skipped, the real engine is not built (make real-engine)")
        return 0
    spec = load_endpoint(SPEC)
    if args.measured:
        rows = json.loads(args.measured.read_text())
        configs = [r["config"] for r in rows]
        for r in rows:  # the measured curve's interpolated capacity by today's estimator
            if r.get("summary") and Path(r["summary"]).exists():
                r["capacity_interp_rps"] = reinterpolate(json.loads(Path(r["summary"]).read_text())["steps"])
    else:
        rows = []
        configs = [dict(spec.server_config)] + [{**spec.server_config, **parse_config(c)} for c in args.config]
    calibrated = calibrations.load(args.calibration).to_efficiency() if args.calibration else None
    pool_dir = args.work / "pool"
    if not (pool_dir / "replay_pool.parquet").exists():  # token counts by the served model's own tokenizer
        build_pool(spec.log_paths(), spec.name, pool_dir,
                   tokenizer_path=str(ROOT / ".real-engine" / "tiny-llama" / "tokenizer.json"))
    pool = AdaptedPool(read_pool(pool_dir), limits_from_options(spec))
    print(pool.summary())
    settings = measurement_profile("standard").with_overrides(
        step_duration_s=args.step_duration, min_completed=15, start_rps=args.start_rps, max_steps=args.max_steps,
        warmup_s=5.0, request_timeout_s=60.0).capacity
    for k, cfg in enumerate(configs):
        if not args.measured:
            rows.append(measure(spec, cfg, pool, settings, args.seed,
                                args.work / "runs" / f"{time.strftime('%Y%m%dT%H%M%S')}-{config_hash(cfg)}"))
        r = rows[k]
        print(f"{json.dumps(r['config']):60s} start {r['startup_s']:5.0f} s  capacity {r['capacity_rps']:.3g} req/s  "
              f"{'valid' if r['valid'] else 'INVALID'}  ttft p99 {r['ttft_p99_ms'] or float('nan'):.0f} ms  "
              f"tpot p99 {r['tpot_p99_ms'] or float('nan'):.0f} ms  lag-invalid steps {r['lag_invalid_steps']}/"
              f"{r['steps']}  failures {r['failures'] or 'none'}", flush=True)
        r["emulator_default"] = predict(spec, cfg, pool, settings, args.seed, searches=args.searches)
        if calibrated is not None:
            r["emulator_calibrated"] = predict(spec, cfg, pool, settings, args.seed, calibrated, searches=args.searches)
    print(f"\nSLA {spec.sla}; emulator: {emulator_view(spec, {}).endpoint.hardware.gpu}, card {model_json.relative_to(ROOT)}; "
          f"not modelled: {sorted({k for r in rows for k in r['emulator_default']['not_modelled']}) or 'none'}")
    cols = ["emulator_default"] + (["emulator_calibrated"] if calibrated is not None else [])
    print("capacities: the interpolated SLA crossing (req/s), as the campaign's verdicts compare them; emulator "
          f"columns: the median of {args.searches} searches (range in brackets)")
    print(f"{'vLLM config':48s} {'measured':>9s} " + " ".join(f"{c.split('_')[1]:>20s}" for c in cols)
          + "  direction vs baseline (measured / " + " / ".join(c.split("_")[1] for c in cols) + ")")
    base = rows[0]
    agree = {c: [0, 0] for c in cols}
    errors: dict[str, list[float]] = {c: [] for c in cols}
    for r in rows:
        cfg = {k: v for k, v in r["config"].items() if base["config"].get(k) != v} or "baseline"
        line = f"{json.dumps(cfg):48s} {cap(r):9.3g} " + " ".join(
            f"{cap(r[c]):7.3g} [{min(r[c].get('searches') or [cap(r[c])]):.3g}-{max(r[c].get('searches') or [cap(r[c])]):.3g}]"
            for c in cols)
        if r is not base and cap(base) > 0:
            m = direction(cap(r), cap(base))
            ds = [direction(cap(r[c]), cap(base[c])) if cap(base[c]) > 0 else None
                  for c in cols]
            for c, d in zip(cols, ds):
                agree[c][0] += d == m
                agree[c][1] += 1
                if cap(r) > 0:
                    errors[c].append(cap(r[c]) / cap(r) - 1)
            line += f"  {m:+d} / " + " / ".join("?" if d is None else f"{d:+d}" for d in ds)
        print(line)
    for c in cols:
        if agree[c][1]:
            print(f"direction agreement ({c.split('_')[1]} factors, 5% dead band): {agree[c][0]}/{agree[c][1]}")
        if errors[c]:
            e = sorted(abs(x) for x in errors[c])
            print(f"capacity error ({c.split('_')[1]} factors, the {len(e)} configs other than the baseline): median "
                  f"{statistics.median(e):.1%}, worst {e[-1]:.1%} (" + ", ".join(f"{x:+.0%}" for x in errors[c]) + ")")
    if calibrated is not None:
        replay_table(spec, rows, pool, calibrated)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    if args.campaign:
        return campaign(args.campaign, args.work, args.lake)
    return 0


if __name__ == "__main__":
    sys.exit(main())
