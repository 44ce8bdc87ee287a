"""Endpoints nobody here has tuned (issue 33): N endpoint specs generated from a seed the campaign never reads,
each researched by ``autoresearch campaign run`` and scored against a strong reference on its true engine.

Each endpoint draws, from ``random.Random(f"unseen-{seed}-{i}")``: a model of the emulator's config.json catalog
(``emulator.catalog.MODELS``), a GPU type and the fewest GPUs (sometimes twice as many) its weights fit on, its
traffic (the supported trace formats: the bundled azure, burstgpt and mooncake samples and the demo's OpenAI chat
logs, or a synthetic shape of ``benchmarks.suite.SHAPES``; each kind in turn, shuffled, so N >= 8 covers them all),
an SLA (TTFT with ITL, TTFT with TPOT, or TTFT only), a production config of plausible operator settings (the
parallel degrees it needs, up to two non-lossy knobs) and hidden efficiency factors of the true engine
(``engine_options.hidden_factors_seed``, a 7-digit draw, never one of the suite's).

The campaign runs through the CLI (``python -m autoresearch_dagster campaign run``, the offline proposer, the quick
measurement profile) in a temporary directory (its memory and lake stay there). Its gain is measured on the true
engine: the noise-free capacity (``bench_search.true_capacity``) of the config it ended on over the production
config's. The reference is the best of: ``--ref-trials`` noise-free Optuna TPE trials on the true engine
(``agents.search.TPE``), the one-at-a-time screen and the grid over the knobs that matter
(``bench_search.screen_configs`` / ``grid_configs``), and every config the campaign promoted; lossy configs count
only when they pass the correctness gate (as in bench_search). A promotion whose config is truly slower than the
one it replaced is a false "better".

Targets (issue 33): on endpoints whose reference gain is >= 1.10x, the median share of the reference gain reached
(``(campaign - 1) / (reference - 1)``) >= 90% and a confirmed gain (> 1.0 on the true engine) on >= 80% of them;
no false "better" anywhere.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_search import _gate, grid_configs, screen_configs, true_capacity  # noqa: E402
from benchmarks.suite import SHAPES, SUITE  # noqa: E402

from autoresearch_dagster.agents.search import PARALLEL_KNOBS, TPE, SearchSpace, static_problem  # noqa: E402
from autoresearch_dagster.campaign.loop import gate_key  # noqa: E402
from autoresearch_dagster.emulator.catalog import GPUS, MODELS  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool, write_pool  # noqa: E402
from autoresearch_dagster.spec import KNOBS, EndpointSpec, config_hash, is_lossy, load_endpoint, validate_server_config  # noqa: E402

TRACES = {"azure": ROOT / "examples/traces/azure_sample.csv", "burstgpt": ROOT / "examples/traces/burstgpt_sample.csv",
          "mooncake": ROOT / "examples/traces/mooncake_sample.jsonl", "openai": ROOT / "examples/logs/demo_chat.jsonl"}
TRAFFIC = [*TRACES, *SHAPES]
SERVING_GPUS = ("H100", "H200", "B200", "A100", "L40S")
SUITE_HIDDEN_SEEDS = frozenset(b.hidden_seed for b in SUITE)
# knobs an operator plausibly sets in production; parallel degrees follow the model's size, lossy ones are left
# for the campaign to stake (its correctness gate), speculative decoding needs a draft model nobody chose
OPERATOR_KNOBS = ("chunked_prefill_size", "schedule_policy", "max_running_requests", "mem_fraction_static",
                  "page_size", "cuda_graph_max_bs_decode", "schedule_conservativeness", "enable_mixed_chunk")
_W: dict = {}


@dataclass
class Unseen:
    name: str
    model: str
    gpu: str
    gpus: int
    sla: str
    sla_kind: str
    traffic: str
    hidden_seed: int
    server_config: dict = field(default_factory=dict)

    def spec_dict(self, pool_dir: Path) -> dict:
        d = {"name": self.name, "model": self.model, "hardware": {"gpu": self.gpu, "count": self.gpus},
             "sla": self.sla, "server_config": dict(self.server_config), "engine": "emulator",
             "engine_options": {"hidden_factors_seed": self.hidden_seed}}
        if self.traffic in TRACES:
            d["workload"] = {"logs": [str(TRACES[self.traffic])], "format": self.traffic, "mode": "capacity"}
        return d

    def write(self, out: Path) -> tuple[Path, Path | None]:
        """The spec file, and the synthetic pool it is run on (None: the campaign builds it from the trace)."""
        out.mkdir(parents=True, exist_ok=True)
        pool = None
        if self.traffic in SHAPES:
            rows = SHAPES[self.traffic](random.Random(f"{self.name}-{self.hidden_seed}"), 800)
            pool = Path(write_pool(rows, out / "pool", {"token_counter": f"synthetic:{self.traffic}"}))
        path = out / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(self.spec_dict(out)))
        return path, pool


def _fits(model: str, gpu: str, n: int) -> bool:
    """The bf16 weights take at most 60% of the GPUs' memory (room for the KV cache)."""
    return MODELS[model].weights_bytes(False) <= 0.6 * GPUS[gpu].memory_bytes * n


def generate(seed: int, n: int) -> list[Unseen]:
    """N endpoint specs drawn from ``seed`` (deterministic; the campaign never sees the seed)."""
    order = list(TRAFFIC)
    random.Random(f"unseen-{seed}-traffic").shuffle(order)
    out = []
    for i in range(n):
        rng = random.Random(f"unseen-{seed}-{i}")
        while True:
            model, gpu = rng.choice(sorted(MODELS)), rng.choice(SERVING_GPUS)
            need = next((g for g in (1, 2, 4, 8) if _fits(model, gpu, g)), None)
            if need is not None:
                break
        gpus = min(8, need * 2) if rng.random() < 0.25 else need
        base: dict = {"tp_size": need} if need > 1 else {}
        space = SearchSpace.full(gpus, base)
        for knob in rng.sample([k for k in OPERATOR_KNOBS if k in space.choices], rng.randint(0, 2)):
            trial = dict(base, **{knob: rng.choice(space.choices[knob])})
            try:
                validate_server_config(trial)
            except Exception:  # noqa: BLE001 -- a combination the knob table refuses is not a production config
                continue
            if not static_problem(trial, gpus):
                base = trial
        base = {k: v for k, v in base.items() if KNOBS[k].canonical(v) != KNOBS[k].canonical(KNOBS[k].default)}
        kind = rng.choice(("ttft+itl", "ttft+tpot", "ttft"))
        ttft = rng.choice((2000, 3000, 5000, 8000))
        sla = f"ttft_p99<={ttft}ms"
        if kind == "ttft+itl":
            sla += f",itl_p99<={rng.choice((100, 150, 250))}ms"
        elif kind == "ttft+tpot":
            sla += f",tpot_p99<={rng.choice((40, 60, 80, 120))}ms"
        hidden = rng.randrange(1_000_000, 10_000_000)
        assert hidden not in SUITE_HIDDEN_SEEDS
        traffic = order[i % len(order)]
        name = f"u{seed}-{i}-{model.replace('.', '')}-{gpus}x{gpu.lower()}-{traffic}"
        out.append(Unseen(name, model, gpu, gpus, sla + ",errors<=1%", kind, traffic, hidden, base))
    return out


def run_campaign(spec: Path, pool: Path | None, workdir: Path, budget: int, timeout_s: float,
                 extra: list[str] = ()) -> dict:
    """``campaign run`` through the CLI, cwd ``workdir`` (a temporary directory: memory and lake stay there)."""
    cmd = [sys.executable, "-m", "autoresearch_dagster", "campaign", "run", "--endpoint", str(spec), "--out", "c",
           "--budget-experiments", str(budget), "--lake", "lake", "--memory", "memory", *extra]
    if pool is not None:
        cmd += ["--pool", str(pool)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTORESEARCH_REDACTION_KEY="bench-unseen")
    t0 = time.monotonic()
    try:
        with (workdir / "campaign.log").open("w") as log:  # its narration, to follow a long run (--keep)
            proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout_s)
        rc, err = proc.returncode, (workdir / "campaign.log").read_text()
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (workdir / "campaign.log").read_text()[-3000:]
    out = {"rc": rc, "wall_s": time.monotonic() - t0}
    report_path, state_path = workdir / "c" / "campaign.json", workdir / "c" / "state.json"
    if rc != 0 or not report_path.exists():
        out["error"] = err[-3000:] if isinstance(err, str) else str(err)
        return out
    report = json.loads(report_path.read_text())
    state = json.loads(state_path.read_text())
    out.update(report=report, eras=[e["config"] for e in state["eras"]],
               pool=str(pool) if pool else str(workdir / "lake" / "_pools" / report["endpoint"] / "replay_pool.parquet"))
    return out


def _init(ep_path: str, pool_path: str) -> None:
    _W["ep"], _W["pool"] = load_endpoint(ep_path), read_pool(pool_path)


def _truth(config: dict) -> tuple[str, float | None]:
    return config_hash(config), true_capacity(_W["ep"], _W["pool"], config)


def reference(ep: EndpointSpec, spec_path: Path, pool_path: str, promoted: list[dict], *, trials: int,
              grid_max: int, workers: int, seed: int) -> dict:
    """True capacities: the production config, the screen and grid, ``trials`` TPE trials and the promoted configs;
    the best of them that passes the correctness gate."""
    base = dict(ep.server_config)
    caps: dict[str, float | None] = {}
    configs: dict[str, dict] = {}
    with mp.get_context("fork").Pool(workers, initializer=_init, initargs=(str(spec_path), pool_path)) as p:
        def run(cfgs: list[dict]) -> list[float | None]:
            todo = {config_hash(c): c for c in cfgs if config_hash(c) not in caps}
            configs.update(todo)
            for h, cap in p.imap_unordered(_truth, list(todo.values())):
                caps[h] = cap
            return [caps[config_hash(c)] for c in cfgs]

        run([base, *promoted])
        if grid_max:  # the screen only serves the grid
            screen = screen_configs(ep.gpus, base)
            run(screen)
            run(grid_configs(ep.gpus, base, {config_hash(c): caps[config_hash(c)] for c in screen},
                             caps[config_hash(base)] or 0.0, max_grid=grid_max))
        tpe = TPE(SearchSpace.full(ep.gpus, base), base, seed=seed, n_startup_trials=min(10, max(1, trials // 3)))
        tpe.add(base, caps[config_hash(base)], "seed")
        left = trials
        while left > 0:
            asked = tpe.ask(min(workers, left))
            if not asked:
                break
            for (trial, cfg), v in zip(asked, run([c for _, c in asked])):
                tpe.tell(trial, cfg, v)
            left -= len(asked)
    gates: dict[str, bool] = {}

    def passes(cfg: dict) -> bool:
        if not is_lossy(cfg, base):
            return True
        k = gate_key(base, cfg)
        if k not in gates:
            gates[k] = bool(_gate(ep, base, cfg, None).get("passed"))
        return gates[k]

    scored = [(cap, configs[h]) for h, cap in caps.items() if cap is not None and passes(configs[h])]
    best_cap, best_cfg = max(scored, key=lambda x: x[0])
    return {"caps": caps, "base_cap": caps[config_hash(base)], "best_cap": best_cap, "best_config": best_cfg,
            "evaluated": len(caps)}


def score(u: Unseen, camp: dict, ref: dict | None) -> dict:
    row = {"name": u.name, "model": u.model, "gpu": f"{u.gpus}x{u.gpu}", "traffic": u.traffic, "sla": u.sla,
           "sla_kind": u.sla_kind, "server_config": u.server_config, "wall_s": camp.get("wall_s")}
    if "error" in camp:
        return {**row, "error": camp["error"], "rc": camp["rc"]}
    rep = camp["report"]
    row.update(experiments=len(rep["experiments"]), verdicts=[e["verdict"] for e in rep["experiments"]],
               ended_because=rep["ended_because"], measured_gain=rep["gain"],
               untested=[q for q in rep.get("open_questions") or [] if "never tested" in q])
    base_cap = ref["base_cap"] if ref else None
    if not base_cap:
        return {**row, "no_capacity": True}
    caps = ref["caps"]
    true = [caps.get(config_hash(c)) or 0.0 for c in camp["eras"]]
    row["false_better"] = [f"era {i}: {true[i] / true[i - 1]:.3f}x" for i in range(1, len(true))
                           if true[i - 1] and true[i] / true[i - 1] < 1.0]
    final = caps.get(config_hash(rep["best_config"])) or 0.0
    row.update(base_cap=base_cap, gain=final / base_cap, ref_gain=ref["best_cap"] / base_cap,
               ref_config=ref["best_config"], ref_evaluated=ref["evaluated"])
    row["share"] = (row["gain"] - 1.0) / (row["ref_gain"] - 1.0) if row["ref_gain"] > 1.0 else None
    return row


def summarize(rows: list[dict]) -> list[str]:
    lines = [f"{'endpoint':44s} {'GPU':>7s} {'traffic':>9s} {'sla':>9s} {'exp':>3s} {'gain':>6s} {'ref':>6s} "
             f"{'share':>6s} {'false+':>6s} {'wall':>5s}  verdicts"]
    for r in rows:
        head = f"{r['name'][:44]:44s} {r['gpu']:>7s} {r['traffic']:>9s} {r['sla_kind']:>9s}"
        if "error" in r:
            lines.append(f"{head} CAMPAIGN FAILED (rc {r['rc']}): {r['error'].strip().splitlines()[-1] if r['error'].strip() else ''}")
            continue
        if r.get("reference_error"):
            lines.append(f"{head} {r['experiments']:3d} reference failed: {r['reference_error']}; verdicts "
                         f"{','.join(v or '-' for v in r['verdicts'])}")
            continue
        if r.get("no_capacity"):
            lines.append(f"{head} {r['experiments']:3d} production config meets the SLA at no rate on the true engine "
                         f"({r['ended_because']})")
            continue
        share = f"{100 * r['share']:5.0f}%" if r["share"] is not None else "     -"
        lines.append(f"{head} {r['experiments']:3d} {r['gain']:6.3f} {r['ref_gain']:6.3f} {share} "
                     f"{len(r['false_better']):6d} {r['wall_s']:5.0f}  {','.join(v or '-' for v in r['verdicts'])}")
        lines.append(f"{'':44s}   SLA {r['sla']}; production {json.dumps(r['server_config'], sort_keys=True)}; "
                     f"ended: {r['ended_because']}" + (f"; untested: {len(r['untested'])}" if r["untested"] else ""))
    scored = [r for r in rows if "gain" in r]
    if not scored:
        lines.append("no endpoint scored")
        return lines
    lines.append(f"medians over {len(scored)} scored endpoint(s): experiments {np.median([r['experiments'] for r in scored]):.1f}, "
                 f"gain {np.median([r['gain'] for r in scored]):.3f}, reference {np.median([r['ref_gain'] for r in scored]):.3f}")
    big = [r for r in scored if r["ref_gain"] >= 1.10]
    if big:
        med = float(np.median([r["share"] for r in big]))
        found = sum(r["gain"] > 1.0 for r in big) / len(big)
        lines.append(f"target: median share of the reference gain on the {len(big)} endpoint(s) with reference >= 1.10x "
                     f">= 90%: {100 * med:.0f}% {'met' if med >= 0.9 else 'NOT met'}")
        lines.append(f"target: a confirmed gain on >= 80% of them: {100 * found:.0f}% {'met' if found >= 0.8 else 'NOT met'}")
    else:
        lines.append("target (reference >= 1.10x): no such endpoint in this draw")
    fb = [f"{r['name']} {x}" for r in scored for x in r["false_better"]]
    lines.append(f"target: no false 'better' (a promotion truly slower than what it replaced): "
                 f"{'met' if not fb else 'NOT met: ' + '; '.join(fb)}")
    untested = [r["name"] for r in scored if r["untested"]]
    lines.append(f"ended with an untested direction: {', '.join(untested) if untested else 'none'}")
    failed = [r["name"] for r in rows if "error" in r]
    if failed:
        lines.append(f"campaign failures: {', '.join(failed)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, help="generator seed (default: fresh, from the clock)")
    ap.add_argument("--n", type=int, default=6, help="endpoints (default 6)")
    ap.add_argument("--budget-experiments", type=int, default=12)
    ap.add_argument("--ref-trials", type=int, default=100, help="noise-free Optuna trials of the reference")
    ap.add_argument("--grid-max", type=int, default=300, help="most reference grid points (0: no screen, no grid)")
    ap.add_argument("--workers", type=int, default=2, help="processes for the reference's true capacities")
    ap.add_argument("--campaign-timeout", type=float, default=3600.0, help="seconds per campaign")
    ap.add_argument("--quick", action="store_true", help="n=2, budget 3, ref-trials 10, grid 20")
    ap.add_argument("--campaign-args", default="", help="extra `campaign run` options (e.g. '--noise-runs 3')")
    ap.add_argument("--only", type=int, help="run only endpoint i of the draw (to time one)")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--keep", help="keep each endpoint's campaign directory under this path (not deleted after)")
    ap.add_argument("--summarize", nargs="+", metavar="ROWS_JSON",
                    help="run nothing: print the table and targets of rows saved with --out (e.g. --only runs in parallel)")
    args = ap.parse_args(argv)
    if args.summarize:
        rows = [r for f in args.summarize for r in json.loads(Path(f).read_text())]
        for line in summarize(rows):
            print(line)
        return 0
    if args.quick:
        args.n, args.budget_experiments, args.ref_trials, args.grid_max = 2, 3, 10, 20
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000_007
    t0 = time.monotonic()
    specs = generate(seed, args.n)
    hidden = [u.hidden_seed for u in specs]
    print(f"bench_unseen: generator seed {seed} ({'given' if args.seed is not None else 'fresh, from the clock'}); "
          f"hidden engine seeds {hidden}: none is the suite's ({sorted(SUITE_HIDDEN_SEEDS)}); budget "
          f"{args.budget_experiments} experiments, reference {args.ref_trials} TPE trials + grid <= {args.grid_max}",
          flush=True)
    rows = []
    for i, u in enumerate(specs):
        if args.only is not None and i != args.only:
            continue
        keep = Path(args.keep) / f"{i}-{u.name}" if args.keep else None
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        with (contextlib.nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory(prefix="bench-unseen-")) as tmp:
            work = Path(tmp)
            spec, pool = u.write(work)
            print(f"[{time.monotonic() - t0:6.0f} s] {u.name}: {u.sla}, production {u.server_config}", flush=True)
            camp = run_campaign(spec, pool, work, args.budget_experiments, args.campaign_timeout,
                                shlex.split(args.campaign_args))
            print(f"[{time.monotonic() - t0:6.0f} s]   campaign: rc {camp['rc']}, {camp['wall_s']:.0f} s", flush=True)
            ref, ref_error = None, None
            if "error" not in camp:
                try:
                    ref = reference(load_endpoint(spec), spec, camp["pool"], camp["eras"], trials=args.ref_trials,
                                    grid_max=args.grid_max, workers=args.workers, seed=seed % 2**31)
                except Exception as e:  # noqa: BLE001 -- the campaign's row is still reported
                    ref_error = f"{type(e).__name__}: {e}"
            row = score(u, camp, ref)
            if ref_error:
                row["reference_error"] = ref_error
            rows.append(row)
            if args.out:
                Path(args.out).write_text(json.dumps(rows, default=str, indent=1))
            print(f"[{time.monotonic() - t0:6.0f} s]   " + json.dumps(
                {k: row.get(k) for k in ("experiments", "gain", "ref_gain", "share", "false_better", "verdicts",
                                         "ended_because", "error")}, default=str)[:1500], flush=True)
    print()
    for line in summarize(rows):
        print(line)
    print(f"seeds: generator {seed}, hidden {hidden} (fresh: not tuned on; the suite's hidden seeds are "
          f"{sorted(SUITE_HIDDEN_SEEDS)}); wall {time.monotonic() - t0:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, default=str, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
