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
``--bank`` makes that closer to the emulator's own distribution. Because a speed factor's capacity
effect moves between banks (0.9565 gave -4.3% once, 0.95 gave -6.25% another time), ``--exact 0.05``
scales the measured faster and slower banks so their true ratios are exactly +-5%: each run keeps its own
measured noise, only the effect is set, which is what the power targets are stated at.

Two procedures, on the same banks, side by side:
- ``classic``: interleaved fresh arms, 5 -> 10 -> 20 runs per arm, a "better" confirmed on fresh runs;
- ``shared`` (what campaigns run): the baseline arm starts from a noise floor drawn from the baseline
  bank, each stage adds fresh baseline anchors (one per ``--shared-anchor-every`` candidate runs), the
  interval is Bonferroni-widened for the candidates sharing the control, a comparison stops as soon as
  it cannot be "better" (futility: what a campaign needs to know), and a "better" is not re-run inside
  the experiment: it is confirmed when the promoted config's own noise floor is measured, which the
  benchmark draws too and reports as "better, replicated". Its runs are warm-started as the harness starts
  them (``experiment._Experiment.capacity_start``): a run the harness asks to start at an estimate of its
  arm's capacity comes from a bank of warm-started runs of that server (phase 1b: searches from a few of the
  server's own cold runs' median, first move x1.05, 3% resolution), a cold one (the candidate's first run,
  the noise floor's first) from the cold bank.
The GPU-hours of a verdict are those of the runs the experiment measured (the noise floor is paid once
per baseline whichever procedure runs; the shared rows also show it amortized over the 3 candidates).
``--seed-base`` moves every phase-1 seed: banks measured with the same base share their deployments' noise
draws (only the pool's redaction key differs), so a bank meant to be independent needs a base of its own.
A fourth bank, ``large`` (the demo's mixed-chunk candidate, about +35% at these settings), stands for
the large effects a campaign's verdicts mostly are.

Targets (issue 5): A/A "better" or "worse" <= 2%; true +5% "better" >= 90%; true -5% "worse" >= 90%.
Target (issue 11): the shared procedure's median GPU-hours per decided verdict at most half the classic's,
with those rates kept.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
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
from autoresearch_dagster.experiments.experiment import SharedControl, run_experiment  # noqa: E402
from autoresearch_dagster.experiments.runs import (INTERP_METRIC, HarnessSettings, RunRecord, execute_run,  # noqa: E402
                                                   warm_started)
from autoresearch_dagster.measure.capacity import reinterpolate  # noqa: E402
from autoresearch_dagster.measure.profiles import WARM_GROWTH, WARM_RESOLUTION, CapacitySettings  # noqa: E402
from autoresearch_dagster.outputs.files import atomic_write_bytes  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.pool.build import build_pool
from autoresearch_dagster.spec import Budget, load_endpoint  # noqa: E402

CANDIDATE_CHANGE = {"stream_interval": 1}  # the knob's default: a change in name only
LARGE_CHANGE = {"enable_mixed_chunk": True}  # a real config change with a large effect on the demo
SHARED = {"noise_runs": 5, "anchor_every": 1, "comparisons": 3}
SPEEDS = {"baseline": 1.0}
_W: dict = {}


def scaled_efficiency(speed: float, base: Efficiency | None = None) -> Efficiency:
    """Every kernel class and CPU overhead ``speed`` times faster: each iteration takes 1/speed as long."""
    e = base or Efficiency()
    return e.replace(gemm_mfu=e.gemm_mfu * speed, moe_mfu=e.moe_mfu * speed, attn_mfu=e.attn_mfu * speed,
                     mbu=e.mbu * speed, kv_mbu=e.kv_mbu * speed, comm_eff=e.comm_eff * speed,
                     step_overhead_s=e.step_overhead_s / speed, per_req_overhead_s=e.per_req_overhead_s / speed,
                     eager_layer_s=e.eager_layer_s / speed, kernel_floor_s=e.kernel_floor_s / speed)


def _init(endpoint_path: str, pool_path: str, settings: HarnessSettings, speeds: dict[str, float]) -> None:
    ep = load_endpoint(endpoint_path)
    own = EmulatorEngine(ep).efficiency  # the endpoint engine's own (hidden) factors, when the spec sets them
    _W.update(endpoint=ep, pool=read_pool(pool_path), settings=settings,
              engines={arm: EmulatorEngine(ep, efficiency=own if s == 1.0 else scaled_efficiency(s, own))
                       for arm, s in speeds.items()})


def _config(arm: str, base: dict) -> dict:
    if arm == "baseline":
        return dict(base)
    return {**base, **(LARGE_CHANGE if arm == "large" else CANDIDATE_CHANGE)}


def _measure(task: tuple[str, int, int, float | None]) -> RunRecord:
    arm, i, seed, start = task
    ep = _W["endpoint"]
    engine = _W["engines"]["baseline" if arm == "large" else arm]
    return execute_run(ep, _config(arm, ep.server_config), _W["pool"], engine=engine, arm=arm, run_index=i, seed=seed,
                       purpose="bench", settings=warm_started(_W["settings"], start), mode="capacity")


def _scaled(rec: RunRecord, factor: float) -> RunRecord:
    """The same measured run with every capacity figure times ``factor`` (``--exact``)."""
    return dataclasses.replace(rec, **{f: getattr(rec, f) * factor for f in
                                       ("capacity_rps", "capacity_rps_per_gpu", "capacity_interp_rps")
                                       if getattr(rec, f) is not None})


class BankSource:
    """Draws pre-measured runs without replacement; A/A shares one bank (and one queue) between arms.

    With ``warm`` banks (the shared procedure), a run the harness asks to start at a capacity estimate
    (``capacity_start``) comes from the arm's warm-started bank and a cold one from its cold bank, so the
    benchmark follows the harness's own choice run by run."""

    def __init__(self, banks: dict[str, list[RunRecord]], rng: np.random.Generator,
                 warm: dict[str, list[RunRecord]] | None = None):
        self.banks = {False: banks, True: warm or banks}
        self.queues = {}
        for is_warm, b in self.banks.items():
            shared = b["baseline"] is b["candidate"]
            order = {arm: list(rng.permutation(len(x))) for arm, x in b.items()}
            self.queues[is_warm] = {"baseline": order["baseline"],
                                    "candidate": order["baseline"] if shared else order["candidate"]}

    def __call__(self, arm, config, *, purpose, mode, run_index, seed, capacity_start=None):
        is_warm = capacity_start is not None
        queue = self.queues[is_warm][arm]
        if not queue:
            raise RuntimeError(f"{'warm' if is_warm else 'cold'} bank for {arm} exhausted: raise --bank")
        rec = self.banks[is_warm][arm][queue.pop()]
        return dataclasses.replace(rec, arm=arm, purpose=purpose, run_index=run_index, config=dict(config))

    def draw(self, arm: str, n: int) -> list[RunRecord]:
        """``n`` runs measured before the experiment (a noise floor) as ``measure_noise`` measures them: the first
        one cold, the others started at its capacity (warm, when there are warm banks)."""
        return [self(arm, {}, purpose="noise", mode="capacity", run_index=-1 - i, seed=0,
                     capacity_start=None if i == 0 else 1.0) for i in range(n)]


def _compare(task: tuple[str, str, int]) -> dict:
    procedure, scenario, k = task
    ep = _W["endpoint"]
    arm = {"aa": "baseline", "plus": "faster", "minus": "slower", "large": "large"}[scenario]

    def pair(banks: dict[str, list[RunRecord]]) -> dict[str, list[RunRecord]]:
        return {"baseline": banks["baseline"], "candidate": banks[arm]}

    change = LARGE_CHANGE if scenario == "large" else CANDIDATE_CHANGE
    warm = pair(_W["warm_banks"]) if procedure == "shared" and _W["warm_banks"] else None
    source = BankSource(pair(_W["banks"]), np.random.default_rng(10_000 + k), warm=warm)
    settings = dataclasses.replace(_W["settings"], seed=k)
    kw: dict = {}
    noise_s = 0.0
    if procedure == "shared":
        noise = source.draw("baseline", _W["shared"]["noise_runs"])
        noise_s = sum(r.gpu_seconds for r in noise)
        kw = dict(control=SharedControl(noise, anchor_every=_W["shared"]["anchor_every"]),
                  comparisons=_W["shared"]["comparisons"],
                  noise_cv=stats.noise_floor([r.value(INTERP_METRIC) for r in noise]).cv)
        settings = dataclasses.replace(settings, confirm=False, stop_when_not_better=True)
    res = run_experiment(ep, ep.server_config, {**ep.server_config, **change}, _W["pool"],
                         engine=_W["engines"]["baseline"], settings=settings, budget=Budget(), run_source=source, **kw)
    replicated = None
    if procedure == "shared" and res.verdict == "better":  # the promoted config's own noise floor, drawn fresh
        fresh = [r.value(INTERP_METRIC) for r in source.draw("candidate", _W["shared"]["noise_runs"])]
        control = res.values("baseline")
        replicated = float(np.median(fresh) / np.median(control)) >= 1 + res.stats.margin / 2
    return {"procedure": procedure, "scenario": scenario, "verdict": res.verdict, "runs": len(res.runs),
            "ratio": res.stats.ratio_median if res.stats else None, "gpu_h": res.gpu_seconds / 3600,
            "noise_gpu_h": noise_s / 3600, "replicated": replicated,
            "n_candidate": res.stats.n_candidate if res.stats else None,
            "reason": (res.stats.reason if res.stats else res.reason or "")[:300]}


def _measured_with(key: dict) -> dict:
    """What a bank's runs depend on (the capacity protocol, warm-up, estimator, servers), not how verdicts use them."""
    st = key.get("settings") or {}
    # a capacity setting added since a bank was measured has its default there
    capacity = {**dataclasses.asdict(CapacitySettings()), **(st.get("capacity") or {})}
    return {**key, "settings": {**{k: st.get(k) for k in ("warmup_requests", "estimator", "mode")},
                                "capacity": capacity}}


def _load_banks(path: str | None, key: dict) -> list[RunRecord] | None:
    if not path or not Path(path).exists():
        return None
    with open(path, "rb") as f:
        saved = pickle.load(f)
    if _measured_with(saved["key"]) != _measured_with(key):
        raise SystemExit(f"{path} was measured with other settings: {saved['key']} (now {key}); remove it or "
                         "pass another --banks")
    for rec in saved["runs"]:  # a bank pickled before RunRecord gained a field: give it the field's default
        for f in dataclasses.fields(RunRecord):
            if f.name not in rec.__dict__:
                rec.__dict__[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        # the interpolated capacity by today's estimator (from the run's own steps): a bank outlives estimator changes
        rec.capacity_interp_rps = reinterpolate(rec.steps)
    return saved["runs"]


def _save_banks(path: str, key: dict, recs: list[RunRecord]) -> None:
    atomic_write_bytes(path, pickle.dumps({"key": key, "runs": recs}))


def _runs(args, ctx, path: str | None, key: dict, tasks: list, pool_path: str, settings: HarnessSettings,
          speeds: dict, what: str) -> list[RunRecord]:
    """``tasks``' runs: loaded from ``path`` when it holds runs measured under ``key``, else measured on
    ``--workers`` processes (and saved there)."""
    recs = _load_banks(path, key)
    if recs is not None:
        print(f"{what}: {len(recs)} runs loaded from {path}", flush=True)
        return recs
    print(f"{what}: measuring {len(tasks)} runs on {args.workers} workers, load average {os.getloadavg()[0]:.2f}",
          flush=True)
    with ctx.Pool(args.workers, initializer=_init, initargs=(args.endpoint, pool_path, settings, speeds)) as p:
        recs = p.map(_measure, tasks, chunksize=4)
    if path:
        _save_banks(path, key, recs)
    return recs


def _warm_banks(args, ctx, key: dict, pool_path: str, settings: HarnessSettings, speeds: dict, arms: list[str],
                banks: dict[str, list[RunRecord]], metric: str, cold_ratio: dict[str, float],
                target: dict[str, float]) -> dict[str, list[RunRecord]]:
    """The shared procedure's warm-started runs (``runs.warm_started``), each server's started where the harness
    starts it: at an estimate of that server's own capacity, the median of a few of its runs drawn from its cold
    bank (the baseline: ``--shared-noise-runs``, a noise floor; a candidate: 1 to 5, its first runs). ``--exact``
    scales them as it scales the cold banks, to exactly +-5% against the warm baseline bank: a 120-run bank pins
    its ratio only to about +-1% (the warm and cold ratios printed side by side differ by that much, either way),
    which is a fifth of the effect."""
    rng = np.random.default_rng(20_261_204)
    n_bank = key["n_bank"]
    caps = {arm: [r.value(metric) for r in banks[arm]] for arm in arms}
    tasks = []
    for j, arm in enumerate(arms):
        for i in range(n_bank):
            k = args.shared_noise_runs if arm == "baseline" else 1 + i % 5
            start = float(np.median(rng.choice(caps[arm], size=k, replace=False)))
            tasks.append((arm, i, args.seed_base + 5_000_000 + 1_000_000 * j + i, start))
    wkey = {**key, "warm": {"growth": WARM_GROWTH, "resolution": WARM_RESOLUTION, "noise_runs": args.shared_noise_runs,
                            "starts": "own"}}
    path = str(Path(args.banks).with_suffix(".warm.pkl")) if args.banks else None
    t0 = time.monotonic()
    recs = _runs(args, ctx, path, wkey, tasks, pool_path, settings, speeds,
                 f"phase 1b (the shared procedure's warm-started runs: each server's searches start at an estimate of "
                 f"its own capacity, first move x{WARM_GROWTH}, resolution {WARM_RESOLUTION:.0%})")
    warm = {arm: [r for r in recs if r.arm == arm and r.valid] for arm in arms}
    invalid = {arm: sum(1 for r in recs if r.arm == arm and not r.valid) for arm in arms}
    print(f"  {time.monotonic() - t0:.0f} s; valid runs {[len(b) for b in warm.values()]}, invalid {invalid}")
    for label, bank in (("cold", banks), ("warm", warm)):
        rows = [r for arm in arms for r in bank[arm]]
        nf = stats.noise_floor([r.value(metric) for r in bank["baseline"]])
        print(f"  {label} runs: {np.mean([len(r.steps) for r in rows]):.1f} probes and "
              f"{np.mean([r.gpu_seconds for r in rows]) / 3600:.3f} GPU-h per run (mean, all servers); baseline "
              f"median {nf.median:.3f} req/s, CV {nf.cv:.2%}")
    wbase = [r.value(metric) for r in warm["baseline"]]
    factors = {}
    for arm in ("faster", "slower", "large"):
        ratio, lo, hi, _ = stats.median_ratio_interval(wbase, [r.value(metric) for r in warm[arm]], confidence=0.95)
        if arm in target:  # the target ratio (1 +- EFFECT) over the warm bank's measured one
            factors[arm] = target[arm] / ratio
        print(f"  warm capacity ratio {arm}: {ratio:.4f} (95% CI [{lo:.4f}, {hi:.4f}]; cold {cold_ratio[arm]:.4f})"
              + (f"; --exact scales it by {factors[arm]:.4f}" if arm in factors else ""))
    return {arm: [_scaled(r, factors[arm]) for r in b] if arm in factors else b for arm, b in warm.items()}


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
    ap.add_argument("--seed-base", type=int, default=0,
                    help="added to every phase-1 run seed: banks with different seed bases have independent deployments "
                         "(the same base gives the same per-deployment noise draws; only the pool's redaction key differs)")
    ap.add_argument("--banks", help="pickle file of phase 1's run banks: loaded when it exists (phase 1 is skipped; "
                    "the settings it was measured with must match), else written after phase 1")
    ap.add_argument("--shared-cold", action="store_true",
                    help="shared procedure on the cold banks (every search from --start-rps), as before warm starts")
    ap.add_argument("--shared-noise-runs", type=int, default=SHARED["noise_runs"],
                    help="shared procedure: noise-floor runs the control starts from (the campaign's noise_runs)")
    ap.add_argument("--shared-anchor-every", type=int, default=SHARED["anchor_every"],
                    help="shared procedure: one fresh baseline anchor per this many candidate runs")
    ap.add_argument("--shared-comparisons", type=int, default=SHARED["comparisons"],
                    help="shared procedure: candidates sharing the control (the Bonferroni factor)")
    ap.add_argument("--exact", type=float, default=None, metavar="EFFECT",
                    help="scale the measured faster/slower banks so their true capacity ratios are exactly 1+EFFECT "
                         "and 1-EFFECT (e.g. 0.05): each run keeps its own measured noise, only the effect is set")
    ap.add_argument("--statistic", choices=("median", "hl"), default=stats.VERDICT_STATISTIC,
                    help="the verdicts' comparison statistic: median ratio with a bootstrap interval (the harness's) "
                         "or the Hodges-Lehmann shift of log capacities with its rank interval (a trial)")
    ap.add_argument("--estimator", choices=("interp", "search"), default="interp",
                    help="per-run capacity statistic of the verdicts: the interpolated SLA crossing (default) "
                         "or the search's highest confirmed passing rate")
    ap.add_argument("--extension-multiple", type=int, default=stats.EXTENSION_MULTIPLE,
                    help="a comparison undecided at the run cap may extend to this many times the cap (--extension-rule says which)")
    ap.add_argument("--extension-rule", choices=("promising", "reachable"), default=stats.EXTENSION_RULE,
                    help="which undecided comparisons at the run cap get the extension (stats.worth_extending)")
    ap.add_argument("--rule", choices=("strict", "reference"), default=stats.VERDICT_RULE,
                    help="better/worse rule: the interval beyond 1±margin (strict) or methods.md's (interval beyond 1, "
                         "ratio beyond 1±margin)")
    ap.add_argument("--confidence", type=float, default=stats.DECISION_CONFIDENCE,
                    help="two-sided confidence of the verdict interval (stats.DECISION_CONFIDENCE)")
    ap.add_argument("--correct-worse", action=argparse.BooleanOptionalAction, default=stats.CORRECT_WORSE,
                    help="reference rule: the \"worse\" significance bound also takes the shared control's Bonferroni "
                         "correction (by default only \"better\" does)")
    ap.add_argument("--significance-scale", type=float, default=stats.SIGNIFICANCE_SCALE,
                    help="reference rule: the significance bounds' alpha as a multiple of the verdict interval's")
    ap.add_argument("--dump", help="write every comparison's outcome (verdict, runs, ratio, GPU-hours) to this JSON file")
    args = ap.parse_args()
    stats.VERDICT_STATISTIC = args.statistic  # before the workers fork
    stats.EXTENSION_MULTIPLE = args.extension_multiple
    stats.VERDICT_RULE = args.rule
    stats.EXTENSION_RULE = args.extension_rule
    stats.DECISION_CONFIDENCE = args.confidence
    stats.SIGNIFICANCE_SCALE = args.significance_scale
    stats.CORRECT_WORSE = args.correct_worse
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
        arms = [*speeds, "large"]
        tasks = [(arm, i, args.seed_base + 1_000_000 * j + i, None) for j, arm in enumerate(arms) for i in range(n_bank)]
        ctx = mp.get_context("fork")
        key = {"settings": dataclasses.asdict(settings), "speeds": speeds, "n_bank": n_bank, "endpoint": args.endpoint,
               "large": LARGE_CHANGE, **({"seed_base": args.seed_base} if args.seed_base else {})}
        recs = _runs(args, ctx, args.banks, key, tasks, pool_path, settings, speeds, f"phase 1 ({n_bank} per server)")
        t1 = time.monotonic()
        banks = {arm: [r for r in recs if r.arm == arm and r.valid] for arm in arms}
        invalid = {arm: sum(1 for r in recs if r.arm == arm and not r.valid) for arm in arms}
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
        # the true effect is the banks' median ratio whichever statistic the verdicts use (methods.md's effect), so
        # both statistics face the same effect
        for arm in ("faster", "slower", "large"):
            ratio, lo, hi, _ = stats.median_ratio_interval(base_caps, [r.value(metric) for r in banks[arm]],
                                                           confidence=0.95)
            true_ratio[arm] = ratio
            what = f"speed {speeds[arm]:.4f}" if arm in speeds else f"config {LARGE_CHANGE}"
            print(f"  true capacity ratio {arm} ({what}): {ratio:.4f} "
                  f"(95% CI [{lo:.4f}, {hi:.4f}], {len(base_caps)} vs {len(banks[arm])} runs)")
        cold_ratio, target = dict(true_ratio), {}
        cold_banks = dict(banks)  # as measured: where a warm run of a server starts is an estimate of its own capacity
        if args.exact is not None:
            for arm, want in (("faster", 1 + args.exact), ("slower", 1 - args.exact)):
                target[arm] = want
                factor = want / true_ratio[arm]
                banks[arm] = [_scaled(r, factor) for r in banks[arm]]
                true_ratio[arm] = stats.median_ratio_interval(base_caps, [r.value(metric) for r in banks[arm]])[0]
                print(f"  --exact: {arm} bank scaled by {factor:.4f} -> true capacity ratio {true_ratio[arm]:.4f}")
        warm_banks = None
        if not args.shared_cold:
            warm_banks = _warm_banks(args, ctx, key, pool_path, settings, speeds, arms, cold_banks, metric, cold_ratio,
                                     target)
        if min(len(b) for b in [*banks.values(), *(warm_banks or {}).values()]) < 50:
            print("too few valid runs in a bank to run comparisons", file=sys.stderr)
            return 1
        _W["banks"], _W["warm_banks"] = banks, warm_banks
        _W["shared"] = {"noise_runs": args.shared_noise_runs, "anchor_every": args.shared_anchor_every,
                        "comparisons": args.shared_comparisons}
        print(f"  shared procedure: control from {args.shared_noise_runs} noise-floor runs, one anchor per "
              f"{args.shared_anchor_every} candidate runs, {args.shared_comparisons} comparisons per control")
        _init(args.endpoint, pool_path, settings, speeds)
        print(f"phase 2: {n_cmp} comparisons per scenario and procedure", flush=True)
        jobs = [(proc, sc, k) for proc in ("classic", "shared") for sc in ("aa", "plus", "minus", "large")
                for k in range(n_cmp)]
        with ctx.Pool(args.workers) as p:
            out = p.map(_compare, jobs, chunksize=5)
    t2 = time.monotonic()
    if args.dump:
        atomic_write_bytes(args.dump, json.dumps(out, indent=1).encode())
    names = {"aa": "A/A (baseline vs itself)", "plus": f"faster (true ratio {true_ratio['faster']:.3f})",
             "minus": f"slower (true ratio {true_ratio['slower']:.3f})",
             "large": f"large (true ratio {true_ratio['large']:.3f})"}
    print(f"  {t2 - t1:.0f} s")
    ok = True
    medians = {}
    for proc in ("classic", "shared"):
        print(f"\nprocedure {proc}:")
        print(f"{'scenario':32s} {'better':>7s} {'same':>7s} {'worse':>7s} {'invalid':>7s} {'runs/exp':>9s} "
              f"{'GPU-h/verdict':>13s} {'replicated':>10s}  target")
        for s in ("aa", "plus", "minus", "large"):
            rows = [o for o in out if o["procedure"] == proc and o["scenario"] == s]
            rate = {v: sum(1 for o in rows if o["verdict"] == v) / len(rows) for v in ("better", "same", "worse",
                                                                                      "invalid")}
            gpu = float(np.median([o["gpu_h"] for o in rows if o["verdict"] != "invalid"]))
            rep = [o for o in rows if o["replicated"] is not None]
            rep_rate = sum(1 for o in rep if o["replicated"]) / len(rows) if proc == "shared" else None
            if s == "aa":
                target, met = "better+worse <= 2%", rate["better"] + rate["worse"] <= 0.02
            elif s == "plus":
                target, met = "better >= 90%", rate["better"] >= 0.90
            elif s == "minus":
                target, met = "worse >= 90%", rate["worse"] >= 0.90
            else:
                target, met = "(no target)", True
            ok &= met
            print(f"{names[s]:32s} {rate['better']:7.1%} {rate['same']:7.1%} {rate['worse']:7.1%} "
                  f"{rate['invalid']:7.1%} {np.mean([o['runs'] for o in rows]):9.1f} {gpu:13.2f} "
                  f"{'-' if rep_rate is None else f'{rep_rate:.1%}':>10s}  {target}: {'met' if met else 'NOT met'}")
        decided = [o for o in out if o["procedure"] == proc and o["verdict"] != "invalid"]
        medians[proc] = float(np.median([o["gpu_h"] for o in decided]))
        amort = float(np.median([o["gpu_h"] + o["noise_gpu_h"] / _W["shared"]["comparisons"] for o in decided]))
        print(f"median GPU-hours per decided verdict (all four scenarios): {medians[proc]:.2f}"
              + (f" ({amort:.2f} with the noise floor amortized over {_W['shared']['comparisons']} candidates)"
                 if proc == "shared" else ""))
    ratio = medians["shared"] / medians["classic"] if medians["classic"] else float("nan")
    halved = ratio <= 0.5
    ok &= halved
    print(f"\nshared / classic median GPU-hours per decided verdict: {ratio:.2f} (target <= 0.50: "
          f"{'met' if halved else 'NOT met'})")
    print(f"wall time {t2 - t0:.0f} s (phase 1 {t1 - t0:.0f} s, phase 2 {t2 - t1:.0f} s), "
          f"{args.workers} workers, load average {os.getloadavg()[0]:.2f}")
    print("all targets met" if ok else "some targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
