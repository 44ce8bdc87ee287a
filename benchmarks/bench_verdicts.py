"""Statistical quality of the experiment verdicts on the emulator: A/A false positives and power at ±5%.

Method. Each run of an experiment is an independent fresh deployment, so runs can be measured first
and drawn later. Phase 1 measures banks of runs with the harness's own ``runs.execute_run`` (fresh
emulator deployment, distinct seed, RUNNER's capacity search) for three servers: the baseline, a
server whose every iteration is ``--faster`` times faster (the emulator's documented ``Efficiency``
factors scaled: MFU/MBU x speed, CPU overheads / speed) and one running at ``--slower``. Capacity
does not scale linearly with iteration speed (queueing against fixed SLA thresholds, and a TPOT
bound that lets a faster engine batch more), so the defaults were set from measured banks on the
demo endpoint at the default protocol (40 s steps) to give about +5% and -5% capacity (speed 1.0466
-> +4.5%, 1.0515 -> +5.9%; 0.9462 -> -5.0% / -5.7%; 120 runs per server each). The pool is built from
the demo logs under a fresh redaction key on each run, so a bank's measured true ratio moves by
about +-0.7% between runs (its 95% CI is printed); every
run of the benchmark measures the true ratios again and prints them. The
candidate config is the baseline plus a knob set to its default (``stream_interval: 1``), so the
configs differ in hash only and the speed difference is the only true effect; the true capacity
ratio is measured from the banks and printed. Phase 2 runs ``--comparisons`` experiments per
scenario through ``experiment.run_experiment`` (the same staged 5 -> 10 -> 20 procedure,
confirmation, verdict code) with a ``run_source`` that draws runs without replacement from the
banks, in a fresh random order per comparison. A/A draws both arms from the baseline bank.
Rates are therefore estimates for the empirical run distribution of the banks; a bigger
``--bank`` makes that closer to the emulator's own distribution.

Targets (issue 5): A/A "better" or "worse" <= 2%; true +5% "better" >= 90%; true -5% "worse" >= 90%.
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoresearch_dagster.experiments import stats  # noqa: E402
from autoresearch_dagster.emulator.cost import Efficiency  # noqa: E402
from autoresearch_dagster.engines.emulator import EmulatorEngine  # noqa: E402
from autoresearch_dagster.experiments.experiment import run_experiment  # noqa: E402
from autoresearch_dagster.experiments.runs import INTERP_METRIC, HarnessSettings, RunRecord, execute_run  # noqa: E402
from autoresearch_dagster.measure.profiles import CapacitySettings  # noqa: E402
from autoresearch_dagster.outputs.files import atomic_write_bytes  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.pool.build import build_pool
from autoresearch_dagster.spec import Budget, load_endpoint  # noqa: E402

CANDIDATE_CHANGE = {"stream_interval": 1}  # the knob's default: a change in name only
SPEEDS = {"baseline": 1.0}
_W: dict = {}


def scaled_efficiency(speed: float) -> Efficiency:
    """Every kernel class and CPU overhead ``speed`` times faster: each iteration takes 1/speed as long."""
    e = Efficiency()
    return e.replace(gemm_mfu=e.gemm_mfu * speed, moe_mfu=e.moe_mfu * speed, attn_mfu=e.attn_mfu * speed,
                     mbu=e.mbu * speed, kv_mbu=e.kv_mbu * speed, comm_eff=e.comm_eff * speed,
                     step_overhead_s=e.step_overhead_s / speed, per_req_overhead_s=e.per_req_overhead_s / speed,
                     eager_layer_s=e.eager_layer_s / speed, kernel_floor_s=e.kernel_floor_s / speed)


def _init(endpoint_path: str, pool_path: str, settings: HarnessSettings, speeds: dict[str, float]) -> None:
    ep = load_endpoint(endpoint_path)
    _W.update(endpoint=ep, pool=read_pool(pool_path), settings=settings,
              engines={arm: EmulatorEngine(ep, efficiency=None if s == 1.0 else scaled_efficiency(s))
                       for arm, s in speeds.items()})


def _measure(task: tuple[str, int, int]) -> RunRecord:
    arm, i, seed = task
    ep = _W["endpoint"]
    config = ep.server_config if arm == "baseline" else {**ep.server_config, **CANDIDATE_CHANGE}
    return execute_run(ep, config, _W["pool"], engine=_W["engines"][arm], arm=arm, run_index=i, seed=seed,
                       purpose="bench", settings=_W["settings"], mode="capacity")


class BankSource:
    """Draws pre-measured runs without replacement; A/A shares one bank (and one queue) between arms."""

    def __init__(self, banks: dict[str, list[RunRecord]], rng: np.random.Generator):
        self.banks = banks
        shared = banks["baseline"] is banks["candidate"]
        order = {arm: list(rng.permutation(len(b))) for arm, b in banks.items()}
        self.queues = {"baseline": order["baseline"], "candidate": order["baseline"] if shared else order["candidate"]}

    def __call__(self, arm, config, *, purpose, mode, run_index, seed):
        if not self.queues[arm]:
            raise RuntimeError(f"bank for {arm} exhausted: raise --bank")
        rec = self.banks[arm][self.queues[arm].pop()]
        return dataclasses.replace(rec, arm=arm, purpose=purpose, run_index=run_index, config=dict(config))


def _compare(task: tuple[str, int]) -> tuple[str, str, int, float | None]:
    scenario, k = task
    ep, banks = _W["endpoint"], _W["banks"]
    cand_bank = {"aa": banks["baseline"], "plus": banks["faster"], "minus": banks["slower"]}[scenario]
    source = BankSource({"baseline": banks["baseline"], "candidate": cand_bank}, np.random.default_rng(10_000 + k))
    res = run_experiment(ep, ep.server_config, {**ep.server_config, **CANDIDATE_CHANGE}, _W["pool"],
                         engine=_W["engines"]["baseline"], settings=dataclasses.replace(_W["settings"], seed=k),
                         budget=Budget(), run_source=source)
    used = len(res.runs)
    return scenario, res.verdict, used, res.stats.ratio_median if res.stats else None


def _load_banks(path: str | None, key: dict) -> list[RunRecord] | None:
    if not path or not Path(path).exists():
        return None
    with open(path, "rb") as f:
        saved = pickle.load(f)
    if saved["key"] != key:
        raise SystemExit(f"{path} was measured with other settings: {saved['key']} (now {key}); remove it or "
                         "pass another --banks")
    for rec in saved["runs"]:  # a bank pickled before RunRecord gained a field: give it the field's default
        for f in dataclasses.fields(RunRecord):
            if f.name not in rec.__dict__:
                rec.__dict__[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return saved["runs"]


def _save_banks(path: str, key: dict, recs: list[RunRecord]) -> None:
    atomic_write_bytes(path, pickle.dumps({"key": key, "runs": recs}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller banks and fewer comparisons")
    ap.add_argument("--comparisons", type=int, help="comparisons per scenario (default 200; --quick 60)")
    ap.add_argument("--bank", type=int, help="measured runs per server (default 120; --quick 60)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--faster", type=float, default=1.048,
                    help="iteration speed factor of the faster server (calibrated for ~ +5%% capacity on the demo)")
    ap.add_argument("--slower", type=float, default=0.9462,
                    help="iteration speed factor of the slower server (calibrated for ~ -5%% capacity on the demo)")
    ap.add_argument("--endpoint", default=str(ROOT / "examples/endpoints/demo.yaml"))
    ap.add_argument("--pool", help="replay pool directory (default: built from the endpoint's logs)")
    ap.add_argument("--step-duration", type=float, default=40.0)
    ap.add_argument("--min-completed", type=int, default=60)
    ap.add_argument("--resolution", type=float, default=0.01)
    ap.add_argument("--hold-e2e-multiple", type=float, default=0.0,
                    help="hold steps >= 1.25 x this many mean E2E latencies (CapacitySettings.hold_e2e_multiple)")
    ap.add_argument("--start-rps", type=float, default=16.0)
    ap.add_argument("--banks", help="pickle file of phase 1's run banks: loaded when it exists (phase 1 is skipped; "
                    "the settings it was measured with must match), else written after phase 1")
    ap.add_argument("--estimator", choices=("interp", "search"), default="interp",
                    help="per-run capacity statistic of the verdicts: the interpolated SLA crossing (default) "
                         "or the search's highest confirmed passing rate")
    args = ap.parse_args()
    n_cmp = args.comparisons or (60 if args.quick else 200)
    n_bank = args.bank or (60 if args.quick else 120)
    if n_bank < 50:
        ap.error("--bank must be at least 50 (an A/A comparison can use 25 runs per arm)")
    t0 = time.monotonic()
    ep = load_endpoint(args.endpoint)
    with tempfile.TemporaryDirectory() as tmp:
        pool_path = args.pool or str(build_pool(ep.log_paths(), ep.name, Path(tmp) / "pool").pool_path)
        settings = HarnessSettings(capacity=CapacitySettings(step_duration_s=args.step_duration,
                                                             min_completed=args.min_completed, warmup_s=0.0,
                                                             resolution=args.resolution, start_rps=args.start_rps,
                                                             hold_e2e_multiple=args.hold_e2e_multiple),
                                   warmup_requests=4, estimator=args.estimator)
        metric = INTERP_METRIC if args.estimator == "interp" else "capacity_rps"
        speeds = {"baseline": 1.0, "faster": args.faster, "slower": args.slower}
        tasks = [(arm, i, 1_000_000 * j + i) for j, arm in enumerate(speeds) for i in range(n_bank)]
        ctx = mp.get_context("fork")
        key = {"settings": dataclasses.asdict(settings), "speeds": speeds, "n_bank": n_bank, "endpoint": args.endpoint}
        cached = _load_banks(args.banks, key)
        if cached is not None:
            recs = cached
            print(f"phase 1: {len(recs)} runs loaded from {args.banks}", flush=True)
        else:
            print(f"phase 1: measuring {len(tasks)} runs ({n_bank} per server) on {args.workers} workers, "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
            with ctx.Pool(args.workers, initializer=_init, initargs=(args.endpoint, pool_path, settings, speeds)) as p:
                recs = p.map(_measure, tasks, chunksize=4)
            if args.banks:
                _save_banks(args.banks, key, recs)
        t1 = time.monotonic()
        banks = {arm: [r for r in recs if r.arm == arm and r.valid] for arm in speeds}
        invalid = {arm: sum(1 for r in recs if r.arm == arm and not r.valid) for arm in speeds}
        reasons = sorted({x.split(":")[0] for r in recs if not r.valid for x in r.invalid_reasons})
        print(f"  {t1 - t0:.0f} s; valid runs {[len(b) for b in banks.values()]}, invalid {invalid} {reasons}")
        fallback = sum(1 for b in banks.values() for r in b if r.capacity_interp_rps is None)
        for name, m in (("search", "capacity_rps"), ("interp", INTERP_METRIC)):
            nf = stats.noise_floor([r.value(m) for r in banks["baseline"]])
            print(f"  baseline capacity ({name}): median {nf.median:.3f} req/s, CV {nf.cv:.2%} "
                  f"(the default emulator noise)" + (f"; {fallback} valid runs without a crossing fall back "
                                                      "to the search value" if name == "interp" else ""))
        print(f"  verdicts use the {args.estimator} estimator ({metric})")
        base_caps = [r.value(metric) for r in banks["baseline"]]
        true_ratio = {}
        for arm in ("faster", "slower"):
            v = stats.verdict(base_caps, [r.value(metric) for r in banks[arm]], noise_cv=0.0)
            true_ratio[arm] = v.ratio_median
            print(f"  true capacity ratio {arm} (speed {speeds[arm]:.4f}): {v.ratio_median:.4f} "
                  f"(95% CI [{v.ci_low:.4f}, {v.ci_high:.4f}], {v.n_baseline} vs {v.n_candidate} runs)")
        if min(len(b) for b in banks.values()) < 50:
            print("too few valid runs in a bank to run comparisons", file=sys.stderr)
            return 1
        _W["banks"] = banks
        _init(args.endpoint, pool_path, settings, speeds)
        print(f"phase 2: {n_cmp} comparisons per scenario", flush=True)
        jobs = [(s, k) for s in ("aa", "plus", "minus") for k in range(n_cmp)]
        with ctx.Pool(args.workers) as p:
            out = p.map(_compare, jobs, chunksize=5)
    t2 = time.monotonic()
    names = {"aa": "A/A (baseline vs itself)", "plus": f"faster (true ratio {true_ratio['faster']:.3f})",
             "minus": f"slower (true ratio {true_ratio['slower']:.3f})"}
    print(f"  {t2 - t1:.0f} s")
    print(f"{'scenario':32s} {'better':>7s} {'same':>7s} {'worse':>7s} {'invalid':>7s} {'runs/exp':>9s}  target")
    ok = True
    for s in ("aa", "plus", "minus"):
        rows = [o for o in out if o[0] == s]
        rate = {v: sum(1 for o in rows if o[1] == v) / len(rows) for v in ("better", "same", "worse", "invalid")}
        mean_runs = float(np.mean([o[2] for o in rows]))
        if s == "aa":
            target, met = "better+worse <= 2%", rate["better"] + rate["worse"] <= 0.02
        elif s == "plus":
            target, met = "better >= 90%", rate["better"] >= 0.90
        else:
            target, met = "worse >= 90%", rate["worse"] >= 0.90
        ok &= met
        print(f"{names[s]:32s} {rate['better']:7.1%} {rate['same']:7.1%} {rate['worse']:7.1%} {rate['invalid']:7.1%} "
              f"{mean_runs:9.1f}  {target}: {'met' if met else 'NOT met'}")
    print(f"wall time {t2 - t0:.0f} s (phase 1 {t1 - t0:.0f} s, phase 2 {t2 - t1:.0f} s), "
          f"{args.workers} workers, load average {os.getloadavg()[0]:.2f}")
    print("all targets met" if ok else "some targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
