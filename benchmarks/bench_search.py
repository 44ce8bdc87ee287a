"""Search efficiency: experiments (and GPU-hours) a method needs to reach 95% of the best config that passes
the correctness gate, on a suite of emulated endpoints, side by side in one run: the offline proposer
(a campaign: recipes + surrogate-guided search), random search and plain Optuna TPE.

Honest ground truth. Each endpoint's engine has hidden efficiency factors (``benchmarks/suite.py``): the
offline proposer's surrogate is the emulator with the documented factors (calibrated on the campaign's
own measurements), so its model is wrong as it would be of a real GPU. The truth of a config is its
capacity on the endpoint's own engine with the run-to-run noise off (same seeds, same capacity search);
the methods only ever see noisy runs through the shared harness.

Reference optimum, per endpoint: a one-at-a-time screen of every knob value of the full search space on
the true engine, around the endpoint's production config, picks the knobs that matter (the six with the
largest effect); an exhaustive grid over them (up to 300 points: each knob's production value and its best
screened values, trimmed to fewer values, then to fewer knobs, when the product is larger) gives the best
config that passes the correctness gate. A config a method promoted that is better still is printed
beside it ("best"); with ``--no-stop`` (every run to its budget) it becomes the optimum the counts are
against, so a method is never scored against less than it found.

Same verdict machinery for all: every experiment goes through ``experiments.run_experiment`` against the
working baseline's shared control (its noise floor), futility stop, no confirmation inside the experiment
(a promoted config's noise floor is re-measured, and paid for); a lossy candidate passes the correctness
gate first (one emulated gate per numerics pair, cached). Random search samples the full knob space (configs
that cannot run at all, e.g. more GPUs than the endpoint has, are resampled for free); TPE asks Optuna's
TPESampler over the same space and is told each candidate's measured capacity. A method's count is the
number of experiments run when the promotion that first reached 95% of the optimum happened (for the
campaign: at the end of that round); a method that never reaches it within its budget counts as budget + 1.
By default a run stops at the promotion that first reaches 95% of the grid's optimum (its count is fixed
then; the rest would cost time only), and the counts are against the grid's optimum.
Each offline campaign's narration (its plans, verdicts, decisions) is written to ``<out>.logs/``.
Every finished run is appended to ``<out>.runs.jsonl``: an interrupted benchmark resumes where it stopped,
and ``--score-only`` scores the endpoints whose runs all finished without running anything new.

Targets (issue 11): the offline proposer's median over the suite <= 12 experiments and at most half of TPE's.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.suite import SUITE, Bench  # noqa: E402

from autoresearch_dagster.agents.search import TPE, SearchSpace, static_problem  # noqa: E402
from autoresearch_dagster.campaign.loop import CampaignRunner, gate_key  # noqa: E402
from autoresearch_dagster.campaign.state import CampaignSettings  # noqa: E402
from autoresearch_dagster.emulator.cost import cost_model_fingerprint  # noqa: E402
from autoresearch_dagster.emulator.noise import NoiseSettings  # noqa: E402
from autoresearch_dagster.engines.base import EngineError  # noqa: E402
from autoresearch_dagster.engines.emulator import EmulatorEngine  # noqa: E402
from autoresearch_dagster.experiments.experiment import SharedControl, correctness_check, run_experiment  # noqa: E402
from autoresearch_dagster.experiments.noise import measure_noise  # noqa: E402
from autoresearch_dagster.experiments.runs import HarnessSettings  # noqa: E402
from autoresearch_dagster.measure.capacity import find_capacity  # noqa: E402
from autoresearch_dagster.measure.profiles import measurement_profile  # noqa: E402
from autoresearch_dagster.memory import Memory  # noqa: E402
from autoresearch_dagster.outputs.files import atomic_write_text  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.spec import Budget, CampaignBudget, config_hash, is_lossy  # noqa: E402

PROFILE = measurement_profile("standard").with_overrides(step_duration_s=40.0, min_completed=60, warmup_s=0.0,
                                                         max_steps=16, noise_runs=5, initial_runs_per_arm=5,
                                                         max_runs_per_arm=10)
TOP_KNOBS = 6
UNMEASURED = "the production baseline's noise floor could not be measured"
MAX_GRID = 300
_W: dict = {}


def truth_protocol() -> str:
    """Key prefix of the true-capacity cache and of the finished runs: the capacity profile, the suite and the
    emulator's cost model (version and default factors, ``cost.cost_model_fingerprint``), in any order and any
    subset of the suite, so numbers computed under another of them are never read."""
    # a capacity setting added since (warm_start) keys nothing at its default: the true capacities are cold searches
    cap = {k: v for k, v in asdict(PROFILE.capacity).items() if not (k == "warm_start" and not v)}
    profile = f"CapacitySettings({', '.join(f'{k}={v!r}' for k, v in cap.items())})"
    return config_hash({"profile": profile, "suite": [str(b) for b in SUITE],
                        "cost_model": cost_model_fingerprint()})[:8]


def load_truth_cache(path: Path, proto: str) -> tuple[dict[str, float | None], int]:
    """The cache's entries under ``proto`` and how many stale ones (another protocol) were dropped: the next
    write of the cache leaves them out."""
    if not path.exists():
        return {}, 0
    entries = json.loads(path.read_text())
    kept = {k: v for k, v in entries.items() if k.split(":", 1)[0] == proto}
    return kept, len(entries) - len(kept)


def _bench(name: str) -> Bench:
    return next(b for b in SUITE if b.name == name)


def _base(name: str) -> dict:
    """The endpoint's production config (its search space and reference grid are built around it)."""
    return dict(_bench(name).endpoint().server_config)


def _pool(name: str):
    key = f"pool:{name}"
    if key not in _W:
        _W[key] = read_pool(_W["pools"][name])
    return _W[key]


def true_capacity(ep, pool, config: dict) -> float | None:
    """A config's capacity on the endpoint's own engine (its hidden factors) with the run-to-run noise off (same
    seeds, same capacity search, ``PROFILE``); None: it cannot run. Shared with ``bench_unseen``."""
    if static_problem(config, ep.gpus):
        return None
    try:
        dep = EmulatorEngine(ep, noise=NoiseSettings.off()).deploy(config, seed=0)
    except Exception:  # noqa: BLE001 -- a config the engine refuses (does not fit) has no capacity
        return None
    res = find_capacity(dep, pool, ep.sla, gpus=ep.gpus, model=ep.model, settings=PROFILE.capacity, seed=0)
    cap = res.capacity_interp_rps if res.capacity_interp_rps is not None else res.capacity_rps
    return float(cap or 0.0)


def truth(task: tuple[str, dict]) -> tuple[str, str, float | None]:
    """(bench, config hash, capacity on the endpoint's own engine with noise off; None: it cannot run)."""
    name, config = task
    return name, config_hash(config), true_capacity(_bench(name).endpoint(), _pool(name), config)


def _gate(ep, baseline: dict, config: dict, pool) -> dict:
    """The correctness gate's answer for this numerics pair, computed once per process and shared."""
    key = gate_key(baseline, config)
    cache = _W.setdefault("gates", {})
    if key not in cache:
        cache[key] = correctness_check(ep, baseline, config, pool, engine=EmulatorEngine(ep))
    return cache[key]


def _harness(seed: int) -> HarnessSettings:
    return HarnessSettings(capacity=PROFILE.capacity, seed=seed, confirm=False, stop_when_not_better=True)


def _reached(name: str, config: dict, target: float | None) -> bool:
    """Whether a promoted config's true capacity reaches the target (the run's count is then fixed)."""
    if not target:
        return False
    cap = truth((name, config))[2]
    return cap is not None and cap >= target


def search_loop(name: str, method: str, seed: int, budget: int, target: float | None = None) -> dict:
    """Random search or TPE through the shared harness: each candidate is an experiment against the working
    baseline; a better one is promoted and its noise floor measured. Stops once a promotion reaches
    ``target`` (its count is fixed then)."""
    ep, pool = _bench(name).endpoint(), _pool(name)
    engine = EmulatorEngine(ep)
    space = SearchSpace.full(ep.gpus)
    rng = random.Random(f"{method}-{seed}")
    base, gpu_s, n = dict(ep.server_config), 0.0, 0
    tpe = TPE(space, base, seed=seed, n_startup_trials=10) if method == "tpe" else None
    try:
        noise = measure_noise(ep, base, pool, engine=engine, runs=PROFILE.noise_runs, settings=_harness(seed))
    except EngineError as e:  # the production config's capacity cannot be measured: this run tests nothing
        return {"bench": name, "method": method, "seed": seed, "experiments": 0,
                "gpu_h": float(getattr(e, "gpu_seconds", 0.0)) / 3600, "trajectory": [], "unmeasured": True,
                "ended_because": f"{UNMEASURED}: {e}"}
    gpu_s += sum(r.gpu_seconds for r in noise.runs)
    control, cv, cap = [r for r in noise.runs if r.valid], noise.capacity_cv, noise.floor.median
    trajectory = [{"experiments": 0, "gpu_h": gpu_s / 3600, "config": base}]
    tried: set[str] = set()
    ended = None
    while n < budget:
        asked = None
        if tpe is not None:
            pair = tpe.ask(1, exclude=tried)
            if not pair:
                break
            asked, cfg = pair[0]
        else:
            cfg = space.sample(rng, dict(ep.server_config))
        h = config_hash(cfg)
        if static_problem(cfg, ep.gpus) or h == config_hash(base) or (tpe is None and h in tried):
            if asked is not None:
                tpe.tell(asked, cfg, None, "cannot run")
            continue
        tried.add(h)
        n += 1
        corr = _gate(ep, base, cfg, pool) if is_lossy(cfg, base) else None
        res = run_experiment(ep, base, cfg, pool, engine=engine, settings=_harness(seed * 1000 + n),
                             budget=Budget(initial_runs_per_arm=PROFILE.initial_runs_per_arm,
                                           max_runs_per_arm=PROFILE.max_runs_per_arm),
                             noise_cv=cv, control=SharedControl(control), correctness=corr)
        gpu_s += res.gpu_seconds
        measured = (res.stats.ratio_median * cap) if res.stats and res.verdict != "invalid" else None
        if asked is not None:
            tpe.tell(asked, cfg, measured, res.verdict)
        if res.verdict == "better":
            base = dict(cfg)
            try:
                noise = measure_noise(ep, base, pool, engine=engine, runs=PROFILE.noise_runs, settings=_harness(seed + n))
            except EngineError as e:  # as a campaign does: the promotion stands unconfirmed and the run ends
                gpu_s += float(getattr(e, "gpu_seconds", 0.0))
                trajectory.append({"experiments": n, "gpu_h": gpu_s / 3600, "config": base})
                ended = f"the noise floor of a promoted config could not be measured: {e}"
                break
            gpu_s += sum(r.gpu_seconds for r in noise.runs)
            control, cv, cap = [r for r in noise.runs if r.valid], noise.capacity_cv, noise.floor.median
            trajectory.append({"experiments": n, "gpu_h": gpu_s / 3600, "config": base})
            if _reached(name, base, target):
                break
    return {"bench": name, "method": method, "seed": seed, "experiments": n, "gpu_h": gpu_s / 3600,
            "trajectory": trajectory, **({"ended_because": ended} if ended else {})}


class _StoppingCampaign(CampaignRunner):
    """A campaign that ends once a promoted baseline (its noise floor measured, as every promotion's is)
    truly reaches the target: the benchmark's count is fixed then, the rest would cost time only."""

    target: float | None = None

    def measure(self):
        era = super().measure()
        if era.index > 0 and _reached(self.endpoint.name, era.config, self.target):
            self._end("reached 95% of the reference optimum (benchmark stop)")
        return era


def campaign(name: str, seed: int, budget: int, target: float | None = None) -> dict:
    """The offline proposer: a campaign (rounds of three experiments, promotions, re-measured baselines)."""
    ep, pool = _bench(name).endpoint(), _pool(name)
    log = Path(_W["logs"]) / f"{name}-offline-s{seed}.log" if _W.get("logs") else None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")

    def say(msg: str) -> None:  # the campaign's own narration, kept to read why it chose what it chose
        if log is not None:
            with log.open("a") as f:
                f.write(msg + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        runner = _StoppingCampaign(ep, pool, engine=EmulatorEngine(ep), out_dir=Path(tmp) / "c", measurement=PROFILE,
                                memory=Memory(Path(tmp) / "memory"), say=say,
                                settings=CampaignSettings(seed=seed, diagnosis_probes=False,
                                                          budget=CampaignBudget(max_experiments=budget)))
        runner.target = target
        runner.run()
        st = runner.state
    done, gpu_s, trajectory = 0, 0.0, [{"experiments": 0, "gpu_h": 0.0, "config": st.original.config}]
    by_round: dict[int, list] = {}
    for e in st.experiments:
        by_round.setdefault(e["round"], []).append(e)
    noise_gpu = {era.index: (era.noise or {}).get("gpu_seconds", 0.0) for era in st.eras}
    gpu_s = noise_gpu.get(0, 0.0)
    trajectory[0]["gpu_h"] = gpu_s / 3600
    for d in st.decisions:
        exps = by_round.get(d["round"], [])
        done += sum(1 for e in exps if e.get("ran"))
        gpu_s += sum(e.get("gpu_seconds") or 0 for e in exps)
        if d.get("promote"):
            era = next((x for x in st.eras if x.source_experiment_id == d["experiment_id"]), None)
            gpu_s += noise_gpu.get(era.index, 0.0) if era else 0.0
            trajectory.append({"experiments": done, "gpu_h": gpu_s / 3600, "config": d["config"]})
    unmeasured = st.original.noise is None  # the production config's capacity cannot be measured
    return {"bench": name, "method": "offline", "seed": seed, "experiments": int(st.spent["experiments"]),
            "gpu_h": st.spent["gpu_seconds"] / 3600, "trajectory": [] if unmeasured else trajectory,
            "ended_because": st.ended_because,
            **({"unmeasured": True} if unmeasured else {})}


def method_job(task: tuple[str, str, int, int, float | None]) -> dict:
    name, method, seed, budget, target = task
    t0 = time.monotonic()
    out = (campaign(name, seed, budget, target) if method == "offline"
           else search_loop(name, method, seed, budget, target))
    out.update(wall_s=time.monotonic() - t0, budget=budget, target=target)
    return out


def _init(pools: dict[str, str], logs: str | None = None) -> None:
    _W["pools"], _W["logs"] = pools, logs


def reference_configs(name: str, screen: dict[str, float | None], default_cap: float) -> list[dict]:
    """The grid over the knobs that matter on the true engine (from the one-at-a-time screen)."""
    return grid_configs(_bench(name).endpoint().gpus, _base(name), screen, default_cap)


def screen_configs(gpus: int, base: dict) -> list[dict]:
    """The one-at-a-time screen around the production config ``base``: every knob value of the full space, and base."""
    space = SearchSpace.full(gpus, base)
    return [space.config({k: v}, base) for k, vals in space.choices.items() for v in vals] + [base]


def grid_configs(gpus: int, base: dict, screen: dict[str, float | None], default_cap: float,
                 max_grid: int = MAX_GRID) -> list[dict]:
    """The exhaustive grid over the ``TOP_KNOBS`` knobs with the largest effect in the screen (config hash ->
    true capacity) around ``base``, trimmed to at most ``max_grid`` points. Shared with ``bench_unseen``."""
    space = SearchSpace.full(gpus, base)
    effect: dict[str, list[tuple[float, object]]] = {}
    for knob, vals in space.choices.items():
        for v in vals:
            cap = screen.get(config_hash(space.config({knob: v}, base)))
            if cap is not None:
                effect.setdefault(knob, []).append((cap, v))
    ranked = sorted(effect, key=lambda k: -max(abs(c - default_cap) for c, _ in effect[k]))[:TOP_KNOBS]
    values = {k: [v for _, v in sorted(effect[k], key=lambda cv: -cv[0])] for k in ranked}
    keep = 4

    def size() -> int:
        return math.prod(len(set(map(repr, [base.get(k)] + v[:keep]))) for k, v in values.items())

    while size() > max_grid and keep > 2:
        keep -= 1
    while size() > max_grid and len(values) > 2:
        values.pop(list(values)[-1])  # the knob with the smallest effect
    grid = {k: list(dict.fromkeys([base.get(k)] + v[:keep])) for k, v in values.items()}  # the production value too
    out = []
    for combo in itertools.product(*grid.values()):
        cfg = space.config(dict(zip(grid, combo)), base)
        if not static_problem(cfg, gpus):
            out.append(cfg)
    return out


def reached(traj: list[dict], caps: dict[str, float], optimum: float, budget: int) -> tuple[int, float]:
    for t in traj:
        if caps.get(config_hash(t["config"]), 0.0) >= 0.95 * optimum:
            return t["experiments"], t["gpu_h"]
    return budget + 1, float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--benches", help="comma-separated names from benchmarks/suite.py, run in this order (default: all)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per method and endpoint (default 2)")
    ap.add_argument("--budget", type=int, default=24, help="experiments per method run (default 24)")
    ap.add_argument("--offline-budget", type=int, default=16, help="experiments of the offline campaign")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--truth-only", action="store_true", help="stop after the reference grids (fills the cache)")
    ap.add_argument("--score-only", action="store_true",
                    help="run nothing new: score the finished runs kept beside --out (endpoints with every run done)")
    ap.add_argument("--no-stop", action="store_true", help="run every method to its budget (no stop at the target)")
    ap.add_argument("--methods", default="offline,random,tpe", help="comma-separated subset of the methods")
    ap.add_argument("--cache", default=str(ROOT / "benchmarks" / "bench_search_truth.json"),
                    help="JSON cache of true capacities, kept in the repository (entries are keyed by the suite, the "
                         "protocol and the emulator's cost model, so a change to any recomputes them; stale entries "
                         "are dropped when the cache is rewritten)")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_search.json"), help="every run's details")
    args = ap.parse_args()
    benches = [_bench(n) for n in args.benches.split(",")] if args.benches else list(SUITE)  # in the order given
    methods = [m for m in ("offline", "random", "tpe") if m in args.methods.split(",")]
    t0 = time.monotonic()
    print(f"search efficiency on {len(benches)} endpoints, {args.seeds} seed(s) per method, budgets "
          f"{args.offline_budget} (offline) / {args.budget} (random, TPE); load average {os.getloadavg()[0]:.2f}",
          flush=True)
    cache_path = Path(args.cache)
    proto = truth_protocol()
    cache, stale = load_truth_cache(cache_path, proto)
    if stale:
        print(f"true-capacity cache: {stale} stale entries (another suite, profile or emulator cost model) ignored; "
              "rebuilding them takes ~50 min of CPU (--truth-only fills the cache)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        pools = {b.name: str(b.pool(Path(tmp))) for b in benches}
        ctx = mp.get_context("fork")
        logs = str(Path(args.out).with_suffix(".logs"))
        with ctx.Pool(args.workers, initializer=_init, initargs=(pools, logs)) as p:
            def truths(tasks: list[tuple[str, dict]]) -> None:
                todo = [t for t in tasks if f"{proto}:{t[0]}:{config_hash(t[1])}" not in cache]
                for name, h, cap in p.imap_unordered(truth, todo, chunksize=2):
                    cache[f"{proto}:{name}:{h}"] = cap
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(cache_path, json.dumps(cache))

            def cap_of(name: str, cfg: dict) -> float | None:
                return cache.get(f"{proto}:{name}:{config_hash(cfg)}")

            print("phase 1: one-at-a-time screen on the true engines", flush=True)
            screens = {b.name: screen_configs(b.endpoint().gpus, _base(b.name)) for b in benches}
            truths([(b.name, c) for b in benches for c in screens[b.name]])
            grids = {b.name: reference_configs(b.name, {config_hash(c): cap_of(b.name, c) for c in screens[b.name]},
                                               cap_of(b.name, _base(b.name)) or 0.0) for b in benches}
            print(f"  {time.monotonic() - t0:.0f} s; phase 2: exhaustive grids "
                  f"({', '.join(f'{n}: {len(g)}' for n, g in grids.items())} points)", flush=True)
            truths([(n, c) for n, g in grids.items() for c in g])
            gate_cache: dict[str, bool] = {}

            def passes(name: str, cfg: dict) -> bool:
                base = _base(name)
                if not is_lossy(cfg, base):
                    return True
                key = gate_key(base, cfg)
                if key not in gate_cache:
                    gate_cache[key] = bool(_gate(_bench(name).endpoint(), base, cfg, None).get("passed"))
                return gate_cache[key]

            # a run stops once a promotion reaches 95% of the grid's optimum (its count is fixed then)
            targets = {b.name: 0.95 * max((cap_of(b.name, c) or 0.0) for c in grids[b.name] if passes(b.name, c))
                       for b in benches}
            t1 = time.monotonic()
            if args.truth_only:
                print(f"  {t1 - t0:.0f} s; grid optima: "
                      + ", ".join(f"{n}: {v / 0.95:.2f}" for n, v in targets.items()), flush=True)
                return 0
            print(f"  {t1 - t0:.0f} s; phase 3: the methods", flush=True)
            jobs = [(b.name, m, s, args.offline_budget if m == "offline" else args.budget,
                     None if args.no_stop else targets[b.name])
                    for b in benches for m in methods for s in range(args.seeds)]
            # finished runs are kept (one JSON line each), so an interrupted benchmark resumes where it stopped
            runs_path = Path(args.out).with_suffix(".runs.jsonl")
            key = lambda j: json.dumps([proto, *j], default=str)  # noqa: E731
            runs = []
            wanted = {key(j) for j in jobs}
            if runs_path.exists():
                for line in runs_path.read_text().splitlines():
                    row = json.loads(line)
                    if row.get("job") in wanted:
                        runs.append(row)
                print(f"  resumed {len(runs)} finished run(s) from {runs_path}", flush=True)
            done = {r["job"] for r in runs}
            runs_path.parent.mkdir(parents=True, exist_ok=True)
            for r in p.imap_unordered(method_job, [] if args.score_only else [j for j in jobs if key(j) not in done]):
                r["job"] = key((r["bench"], r["method"], r["seed"], r["budget"], r["target"]))
                with runs_path.open("a") as f:
                    f.write(json.dumps(r, default=str) + "\n")
                runs.append(r)
                print(f"  {r['bench']:24s} {r['method']:8s} seed {r['seed']}: {r['experiments']} experiments, "
                      f"{r['gpu_h']:.1f} GPU-h, {max(0, len(r['trajectory']) - 1)} promotion(s), {r['wall_s']:.0f} s"
                      + (f" ({r['ended_because']})" if r.get("ended_because") else ""), flush=True)
            finished = {r["job"] for r in runs}
            complete = [b for b in benches if all(key(j) in finished for j in jobs if j[0] == b.name)]
            if len(complete) < len(benches):
                print(f"  scoring the {len(complete)} endpoint(s) whose runs all finished: "
                      f"{', '.join(b.name for b in complete)}", flush=True)
                benches = complete
            truths([(r["bench"], t["config"]) for r in runs for t in r["trajectory"]])

            table, summary = [], {m: [] for m in methods}
            gpu_summary = {m: [] for m in methods}
            dropped: list[str] = []
            for b in benches:
                found = [t["config"] for r in runs if r["bench"] == b.name for t in r["trajectory"]]
                grid_scored = [(cap_of(b.name, c) or 0.0, c) for c in grids[b.name] if passes(b.name, c)]
                found_scored = [(cap_of(b.name, c) or 0.0, c) for c in found if passes(b.name, c)]
                grid_cap, grid_cfg = max(grid_scored, key=lambda x: x[0])
                best_cap, best_cfg = max(grid_scored + found_scored, key=lambda x: x[0])
                # the reference is the grid's optimum unless runs went on past it (--no-stop): a run stopped at the
                # grid's target cannot be scored against a higher optimum it was not allowed to chase
                opt_cap, opt_cfg = (best_cap, best_cfg) if args.no_stop else (grid_cap, grid_cfg)
                caps = {config_hash(c): (cap or 0.0) for cap, c in grid_scored + found_scored}
                row = {"bench": b.name, "default": cap_of(b.name, _base(b.name)), "optimum": opt_cap,
                       "optimum_config": opt_cfg, "best_found": best_cap, "best_found_config": best_cfg}
                for m in methods:
                    mine = [r for r in runs if r["bench"] == b.name and r["method"] == m]
                    # a campaign that ends early (nothing evidence-supported left) without reaching counts as its
                    # budget + 1, like a search that used its whole budget
                    # a run whose production baseline could not be measured (too few valid noise runs) tested
                    # nothing: it is left out and listed, not counted as a miss
                    dropped += [f"{b.name} {m} seed {r['seed']}" for r in mine if r.get("unmeasured")]
                    got = [reached(r["trajectory"], caps, opt_cap, args.offline_budget if m == "offline" else args.budget)
                           for r in mine if not r.get("unmeasured")]
                    row[m] = float(np.median([g[0] for g in got])) if got else float("nan")
                    row[m + "_gpu_h"] = float(np.nanmedian([g[1] for g in got])) if any(
                        not math.isnan(g[1]) for g in got) else float("nan")
                    row[m + "_runs"] = [g[0] for g in got]
                    summary[m].append(row[m])
                    gpu_summary[m].append(row[m + "_gpu_h"])
                table.append(row)
    print("\nexperiments (GPU-hours) to reach 95% of the optimum that passes the correctness gate; "
          f"> budget counts as budget + 1")
    print(f"{'endpoint':24s} {'default':>8s} {'optimum':>8s} {'best':>8s}  " + " ".join(f"{m:>16s}" for m in methods)
          + "  optimum config")
    for r in table:
        cells = [f"{r[m]:5.1f} ({r[m + '_gpu_h']:6.1f} h)" if not math.isnan(r[m + '_gpu_h'])
                 else f"{r[m]:5.1f} (   -   )" for m in methods]
        print(f"{r['bench']:24s} {r['default'] or 0:8.2f} {r['optimum']:8.2f} {r['best_found']:8.2f}  "
              + " ".join(f"{c:>16s}" for c in cells) + f"  {json.dumps(r['optimum_config'], sort_keys=True)}")
    print("optimum: the reference grid's best that passes the gate (what the counts are against); best: the best "
          "config any method promoted, when higher")
    if dropped:
        print(f"left out (the production config's noise floor could not be measured): {', '.join(dropped)}")
    med = {m: float(np.nanmedian(v)) for m, v in summary.items()}
    gmed = {m: float(np.nanmedian(v)) if any(not math.isnan(x) for x in v) else float("nan")
            for m, v in gpu_summary.items()}
    print(f"{'median':24s} {'':8s} {'':8s} {'':8s}  " + " ".join(f"{med[m]:5.1f} ({gmed[m]:6.1f} h)".rjust(16)
                                                      for m in methods))
    def verdict(m: dict[str, float]) -> str:
        return "met" if m["offline"] <= 12 and m["offline"] <= 0.5 * m["tpe"] else "NOT met"

    if "offline" in med and "tpe" in med:
        print(f"target: offline median <= 12 experiments and <= half of TPE's ({med['offline']:.1f} vs "
              f"{med['tpe']:.1f}): {verdict(med)}")
    # an endpoint whose production config already reaches 95% of the optimum counts 0 for every method: it tests
    # nothing and pulls every median down, so the medians without it are printed too
    easy = [r["bench"] for r in table if (r["default"] or 0.0) >= 0.95 * r["optimum"]]
    if easy and len(easy) < len(table):
        rest = {m: float(np.nanmedian([r[m] for r in table if r["bench"] not in easy])) for m in methods}
        print(f"already at 95% of the grid's optimum in production: {', '.join(easy)}; medians without: "
              + ", ".join(f"{m} {v:.1f}" for m, v in rest.items())
              + (f" (target {verdict(rest)})" if "offline" in rest and "tpe" in rest else ""))
    print(f"wall time {time.monotonic() - t0:.0f} s, {args.workers} workers, load average {os.getloadavg()[0]:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps({"table": table, "runs": runs}, default=str, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
