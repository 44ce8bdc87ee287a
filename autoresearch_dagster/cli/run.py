"""Owns `autoresearch run`: the main job, the whole loop for one endpoint through real Dagster runs."""
import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run the loop for one endpoint through Dagster (pool → verdict → promotion → rerun)",
        description="The main job, through real Dagster runs on a persistent instance at DAGSTER_HOME "
                    "(default ./.dagster_home, SQLite): endpoint discovery, the replay pool and its "
                    "fidelity check, the baseline's noise floor and load curve, diagnosis, proposals, "
                    "one experiment with its verdict, the promotion through the promotion sensor and "
                    "the lineage rerun the automation sensor requests. Prints a results table and "
                    "where to look; `dagster dev -w workspace.yaml` then shows the runs and lineage.")
    p.add_argument("--endpoint", required=True, help="endpoint spec file (YAML/JSON)")
    p.add_argument("--out", help="artifacts and results lake (default ./out)")
    p.add_argument("--candidates", help="candidate config files <endpoint>_*.yaml "
                                        "(default: ../candidates beside the spec, else examples/candidates)")
    p.add_argument("--measure", choices=["quick", "standard"], default="quick",
                   help="quick: 5 runs per arm without escalation and the quick diagnosis (default); "
                        "standard: 5 → 10 → 20 runs per arm and the full diagnosis")
    p.add_argument("--dagster-home", help="instance directory (default $DAGSTER_HOME, else ./.dagster_home)")
    p.add_argument("--storage", choices=["sqlite", "postgres"],
                   help="instance storage (default $AUTORESEARCH_DAGSTER_STORAGE, else sqlite); "
                        "postgres reads DAGSTER_PG_HOST/PORT/USERNAME/DB")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from autoresearch_dagster.definitions import run_main_job
    from resources import MeasurementSettings

    settings = MeasurementSettings.quick() if args.measure == "quick" else MeasurementSettings()
    run_main_job(Path(args.endpoint), out_dir=args.out, candidates_dir=args.candidates, settings=settings,
                 home=args.dagster_home, storage=args.storage)
    return 0
