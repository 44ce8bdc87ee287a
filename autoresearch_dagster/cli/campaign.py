"""Owns the `campaign` commands: run a research campaign, show where one stands, record an approval."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from autoresearch_dagster.measure.profiles import PROFILES, measurement_profile
from autoresearch_dagster.spec import SpecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("campaign", help="research campaigns: the system proposes, tests, learns and stops")
    cs = p.add_subparsers(dest="campaign_cmd", metavar="SUBCOMMAND")

    r = cs.add_parser("run", help="run a campaign on one endpoint until its deadline, budget or ideas run out",
                      description="Measure the endpoint's baseline (noise floor), diagnose it, and run rounds of "
                                  "experiments the orchestrator chooses from its proposers' four-part proposals; "
                                  "promote confirmed gains, re-measure and re-diagnose at the new limit; end with "
                                  "DIR/campaign.json, a results table and a review package in DIR/review/. "
                                  "Rerunning with the same --out resumes an interrupted campaign.")
    r.add_argument("--endpoint", required=True, help="endpoint spec (YAML/JSON)")
    r.add_argument("--out", required=True, help="campaign directory (state, rounds, traces, campaign.json, review/)")
    r.add_argument("--proposer", choices=["offline", "claude", "both"], default="offline",
                   help="offline (default: recipes + surrogate-guided search, no key), claude (ANTHROPIC_API_KEY), "
                        "or both")
    r.add_argument("--claude-model", default="claude-sonnet-4-5", help="model for the Claude proposer")
    r.add_argument("--budget-experiments", type=int, default=12, help="most experiments (default 12)")
    r.add_argument("--budget-gpu-hours", type=float, help="most GPU-hours (virtual GPU time on the emulator counts)")
    r.add_argument("--deadline-min", type=float, help="end the campaign this many minutes after it started")
    r.add_argument("--concurrent-gpus", type=int, default=2,
                   help="GPUs measured at once (on the emulator: local worker processes; default 2)")
    r.add_argument("--experiments-per-round", type=int, default=3)
    r.add_argument("--directions", type=int, default=4, help="research directions per round (default 4: all)")
    r.add_argument("--search-trials", type=int, default=6, help="surrogate search trials per offline session")
    r.add_argument("--confirm", choices=["remeasure", "fresh_runs"], default="remeasure",
                   help="confirm a 'better' by the promoted baseline's re-measured noise floor (default) or by "
                        "fresh runs inside the experiment")
    r.add_argument("--measure", choices=sorted(PROFILES), default="quick",
                   help="measurement profile (measure/profiles.py; default quick: steady-state holds, 5 runs per arm)")
    r.add_argument("--step-duration", type=float, help="override the profile: seconds per load step")
    r.add_argument("--hold-e2e-multiple", type=float, help="override the profile: hold each step at least this many "
                                                           "mean E2E latencies (0: fixed --step-duration)")
    r.add_argument("--min-completed", type=int, help="override the profile: completed requests needed per step")
    r.add_argument("--start-rps", type=float, help="override the profile: first probed arrival rate")
    r.add_argument("--growth", type=float, help="override the profile: rate factor between steps below the knee")
    r.add_argument("--request-timeout", type=float, help="override the profile: per-request timeout in seconds "
                                                         "(also how long an overloaded step waits)")
    r.add_argument("--resolution", type=float, help="override the profile: relative capacity resolution")
    r.add_argument("--max-steps", type=int, help="override the profile: most load steps per capacity search")
    r.add_argument("--noise-runs", type=int, help="override the profile: A/A runs of each baseline's noise floor")
    r.add_argument("--runs-per-arm", type=int, help="override the profile: runs per arm (no escalation beyond)")
    r.add_argument("--engine", choices=["emulator", "sglang", "modal"], help="override the endpoint's engine")
    r.add_argument("--pool", help="replay pool (default: built from the endpoint's logs into LAKE/_pools/ENDPOINT)")
    r.add_argument("--lake", default="out/lake", help="results lake root (default out/lake)")
    r.add_argument("--memory", help="memory directory, a git repository of its own (created on first use; default: "
                                    "memory/ beside the lake, out/memory with the default --lake)")
    r.add_argument("--anchor-every", type=int, default=1,
                   help="one fresh baseline anchor run per this many candidate runs (default 1; a real engine whose "
                        "runs take minutes may trade some power for fewer)")
    r.add_argument("--prescreen", action="store_true",
                   help="pre-screen candidates on the calibrated emulator; run only those it predicts to gain at "
                        "least the verdict margin (controls and measured follow-ups exempt)")
    r.add_argument("--drafter", action="store_true",
                   help="the speculative direction may adapt the drafter to the pool's training split: a short "
                        "rehearsal, then a full training run and an experiment when the rehearsal and the surrogate "
                        "support it (training time counts as GPU time in the budget)")
    r.add_argument("--drafter-variants", type=int, default=1, help="most drafters trained (default 1)")
    r.add_argument("--drafter-steps", type=int, default=None,
                   help="head training steps of the full training run (default: the trainer's, 300)")
    r.add_argument("--recalibrate-error", type=float, default=0.10,
                   help="re-calibrate the emulator when the median |ln(measured / emulated)| ratio error of the last "
                        "3 verified experiments exceeds this (default 0.10)")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=run)

    s = cs.add_parser("status", help="where a campaign stands (phase, spent budget, eras, last decision)")
    s.add_argument("--out", required=True, help="campaign directory")
    s.set_defaults(func=status)

    a = cs.add_parser("approve", help="record a human decision on a campaign's review package",
                      description="Approval is a recorded human action: appended to REVIEW/approvals.jsonl and the "
                                  "lake's approvals table. Approving the package of the campaign's latest best config "
                                  "writes the deploy artifact REVIEW/deploy/ (launch command, config diff, the "
                                  "package's hash, who approved it when); a stale package is refused; a rejection "
                                  "deploys nothing. Nothing is run against production.")
    a.add_argument("--review", required=True, help="the review package directory (DIR/review)")
    a.add_argument("--who", required=True)
    a.add_argument("--decision", required=True, choices=["approve", "reject", "request_changes"])
    a.add_argument("--note", default="")
    a.add_argument("--lake", default="out/lake")
    a.set_defaults(func=approve)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def run(args: argparse.Namespace) -> int:
    from autoresearch_dagster.campaign.loop import CampaignRunner
    from autoresearch_dagster.campaign.report import format_report
    from autoresearch_dagster.campaign.state import CampaignSettings, CampaignState
    from autoresearch_dagster.cli._experiments_common import load_pool
    from autoresearch_dagster.engines import make_engine
    from autoresearch_dagster.memory import Memory
    from autoresearch_dagster.outputs.console import Ticker
    from autoresearch_dagster.results import open_lake
    from pydantic import ValidationError

    from autoresearch_dagster.spec import CampaignBudget, load_endpoint, validation_message

    if args.proposer in ("claude", "both") and not os.environ.get("ANTHROPIC_API_KEY"):
        raise SpecError("--proposer claude needs ANTHROPIC_API_KEY in the environment")
    endpoint = load_endpoint(args.endpoint)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {out} is a file, not a directory")
    try:
        budget = CampaignBudget(max_experiments=args.budget_experiments, max_gpu_hours=args.budget_gpu_hours,
                                max_wall_s=args.deadline_min * 60 if args.deadline_min else None,
                                max_concurrent_gpus=args.concurrent_gpus)
        settings = CampaignSettings(proposer=args.proposer, claude_model=args.claude_model,
                                    directions_per_round=args.directions,
                                    experiments_per_round=args.experiments_per_round, search_trials=args.search_trials,
                                    confirm=args.confirm, seed=args.seed, budget=budget, prescreen=args.prescreen,
                                    recalibrate_error=args.recalibrate_error, anchor_every=args.anchor_every,
                                    drafter=args.drafter, drafter_variants=args.drafter_variants,
                                    drafter_train={} if args.drafter_steps is None else {"steps": args.drafter_steps})
    except ValidationError as e:
        raise SpecError(f"campaign settings: {validation_message(e)}") from None
    results = open_lake(args.lake)
    pool = load_pool(endpoint, args, results.pool_dir(endpoint.name))
    engine = make_engine(endpoint, engine=args.engine)
    ended = (out / "state.json").exists() and CampaignState.load(out / "state.json").status == "ended"
    measurement = measurement_profile(args.measure).with_overrides(
        step_duration_s=args.step_duration, hold_e2e_multiple=args.hold_e2e_multiple, min_completed=args.min_completed,
        resolution=args.resolution, max_steps=args.max_steps, start_rps=args.start_rps, growth=args.growth,
        request_timeout_s=args.request_timeout, noise_runs=args.noise_runs,
        initial_runs_per_arm=args.runs_per_arm, max_runs_per_arm=args.runs_per_arm)
    runner = CampaignRunner(endpoint, pool, engine=engine, out_dir=out, settings=settings, measurement=measurement,
                            results=results, memory=Memory(args.memory or Path(args.lake).parent / "memory"), say=Ticker(),
                            fresh=ended)
    report = runner.run()
    results.refresh_views()
    print(format_report(report))
    print(f"  DuckDB:         {results.duckdb_path()}  (autoresearch sql \"SELECT * FROM prediction_scores\")")
    return 0


def status(args: argparse.Namespace) -> int:
    from autoresearch_dagster.campaign.state import CampaignState

    path = Path(args.out) / "state.json"
    if not path.is_file():
        raise SpecError(f"{args.out} holds no campaign (no state.json)")
    st = CampaignState.load(path)
    last = st.decisions[-1] if st.decisions else {}
    print(json.dumps({"campaign_id": st.campaign_id, "endpoint": st.endpoint, "status": st.status, "phase": st.phase,
                      "ended_because": st.ended_because, "spent": st.spent, "eras": [
                          {"index": e.index, "config_hash": e.config_hash, "reason": e.reason,
                           "capacity_rps": (e.noise or {}).get("median")} for e in st.eras],
                      "rounds": len(st.rounds), "experiments": len(st.experiments), "last_decision": last},
                     indent=2, default=str))
    return 0


def approve(args: argparse.Namespace) -> int:
    from autoresearch_dagster.campaign.review import record_approval
    from autoresearch_dagster.results import open_lake

    if not Path(args.review).is_dir():
        raise SpecError(f"--review {args.review} is not a directory")
    row = record_approval(args.review, who=args.who, decision=args.decision, note=args.note,
                          results=open_lake(args.lake))
    print(f"recorded {row['decision']} by {row['who']} for {row['config_hash']} ({row['approval_id']}, package "
          f"{row['package_hash']})")
    if row["deploy_path"]:
        print(f"deploy artifact: {row['deploy_path']}/deploy.json and launch.sh")
    return 0
