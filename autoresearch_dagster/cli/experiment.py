"""Owns `autoresearch experiment run`: baseline vs a candidate config to a verdict with its evidence."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoresearch_dagster.cli._experiments_common import add_measure_args, capacity_settings, open_campaign
from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.spec import Budget, SpecError, load_endpoint, load_server_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="A/B experiments: baseline vs candidate config, with a verdict")
    esub = p.add_subparsers(dest="experiment_cmd", metavar="SUBCOMMAND")
    r = esub.add_parser("run", help="run one experiment and print its verdict with the evidence",
                        description="Interleaves baseline and candidate runs (ABAB, fresh deployment each), "
                                    "5 -> 10 -> 20 runs per arm until the verdict is decided, confirms a 'better' "
                                    "on fresh runs, gates lossy candidates on output correctness. Writes "
                                    "OUT/verdict.json (the verdict) and OUT/experiment.json (every run).")
    add_measure_args(r)
    r.add_argument("--candidate", required=True, help="candidate server config (YAML/JSON knob -> value; "
                                                      "applied on top of the endpoint's server_config)")
    r.add_argument("--repeats", type=int, default=5, help="runs per arm in the first stage (default 5)")
    r.add_argument("--max-repeats", type=int, help="cap on runs per arm (default 4 x --repeats)")
    r.add_argument("--max-wall", type=float, help="wall-time budget in seconds (then an undecided verdict is 'same')")
    r.add_argument("--noise", help="noise.json from `autoresearch noise` (its capacity_cv sets the margin)")
    r.add_argument("--mode", choices=["capacity", "shape", "both"], help="override the endpoint's workload mode")
    r.add_argument("--no-confirm", action="store_true", help="do not confirm a 'better' on fresh runs")
    r.set_defaults(func=handle_run)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def handle_run(args: argparse.Namespace) -> int:
    from autoresearch_dagster.experiments.experiment import run_experiment
    from autoresearch_dagster.experiments.runs import HarnessSettings

    endpoint = load_endpoint(args.endpoint)
    candidate = {**endpoint.server_config, **load_server_config(args.candidate)}
    if args.repeats < 2:
        raise SpecError(f"--repeats must be at least 2, got {args.repeats}")
    budget = Budget(initial_runs_per_arm=args.repeats, max_runs_per_arm=args.max_repeats or 4 * args.repeats,
                    max_wall_s=args.max_wall)
    if budget.max_runs_per_arm < budget.initial_runs_per_arm:
        raise SpecError("--max-repeats must be at least --repeats")
    noise_cv = None
    if args.noise:
        try:
            noise_cv = float(json.loads(Path(args.noise).read_text())["capacity_cv"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SpecError(f"--noise {args.noise}: cannot read capacity_cv ({e})") from None
    out, pool, engine, results, campaign = open_campaign(endpoint, args)
    settings = HarnessSettings(capacity=capacity_settings(args), mode=args.mode, confirm=not args.no_confirm,
                               seed=args.seed, estimator=args.estimator)
    res = run_experiment(endpoint, endpoint.server_config, candidate, pool, engine=engine, results=results,
                         settings=settings, budget=budget, noise_cv=noise_cv, campaign=campaign, progress=print)
    full = res.to_dict()
    write_json(out / "experiment.json", full)
    write_json(out / "verdict.json", res.summary())
    print(render(full))
    print(f"wrote {out / 'verdict.json'} and {out / 'experiment.json'}"
          + (f"; runs recorded in {results.root}" if results is not None else ""))
    return 0


def render(v: dict) -> str:
    lines = [f"VERDICT: {v['verdict'].upper()}" + (" (confirmed)" if v["confirmed"] else ""),
             f"  reason: {v['reason']}"]
    if v["ratio_median"] is not None:
        lines.append(f"  {v['metric']} ratio candidate/baseline (median): {v['ratio_median']:.4f}  "
                     f"{v['confidence']:.0%} CI [{v['ci_low']:.4f}, {v['ci_high']:.4f}]  margin ±{v['margin']:.4f} "
                     f"(noise CV {v['noise_cv']:.4f} from {v['noise_source']})")
    fmt = lambda xs: ", ".join(f"{x:.4g}" for x in xs)  # noqa: E731
    lines.append(f"  baseline  runs={v['runs_baseline']}: [{fmt(v['capacities_baseline'])}]")
    lines.append(f"  candidate runs={v['runs_candidate']}: [{fmt(v['capacities_candidate'])}]")
    lines.append(f"  lossy={v['lossy']}" + (f"  correctness: passed={v['correctness'].get('passed')} "
                                             f"top1={v['correctness'].get('top1_agreement')} "
                                             f"kl_mean={v['correctness'].get('kl_mean')}" if v["correctness"] else ""))
    if v["invalid_reasons"]:
        lines.append("  invalid: " + "; ".join(v["invalid_reasons"]))
    runs = v.get("runs") or []
    caveats = [r["warnings"][0] for r in runs if r.get("warnings")]
    if caveats:
        lines.append(f"  caveat on {len(caveats)} of {len(runs)} runs, e.g.: {caveats[0]}")
    lines.append("  stages: " + ("; ".join(f"{s['stage']}: {s['verdict']} (n={s['n_baseline']}/{s['n_candidate']})"
                                            for s in v["stages"]) or "none (no comparison was run)"))
    return "\n".join(lines)
