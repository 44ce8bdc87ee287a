"""Owns the `autoresearch` command: one argparse tree, one module per command group.

Each module in this package defines ``register(subparsers)`` adding its group; a handler returns
an exit code. Errors the user can fix (bad spec, unreadable logs) print one line and exit 2.
Commands of the Dagster layer (``autoresearch run``: jobs/main_job.py) register through the
``autoresearch.commands`` entry-point group, so the core never imports that layer.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from autoresearch_dagster.spec import SpecError

# command group -> module (kept explicit so --help order is stable)
_GROUPS = ["pool", "replay", "emulator", "noise", "experiment", "campaign", "correctness", "diagnose", "sql"]
PLUGIN_GROUP = "autoresearch.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoresearch",
        description="AutoResearch for LLM inference endpoints: replay pools, open-loop capacity "
                    "measurement, diagnosis, experiments with verdicts, promotion.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  autoresearch pool build --logs examples/logs/demo_chat.jsonl --endpoint demo --out out/pool\n"
               "  autoresearch replay capacity --pool out/pool/replay_pool.parquet --engine emulator \\\n"
               "      --endpoint examples/endpoints/demo.yaml --sla 'ttft_p99<=3000ms,tpot_p99<=60ms' --out out/cap\n"
               "  autoresearch experiment run --endpoint examples/endpoints/demo.yaml \\\n"
               "      --candidate examples/candidates/demo_better.yaml --out out/exp\n",
    )
    sub = parser.add_subparsers(dest="group", metavar="COMMAND")
    for name in _GROUPS:
        try:
            mod = importlib.import_module(f"autoresearch_dagster.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"autoresearch_dagster.cli.{name}":
                continue  # group not built yet
            raise
        mod.register(sub)
    for ep in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except SpecError as e:
        print(f"autoresearch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoresearch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
