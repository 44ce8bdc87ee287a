"""Owns the `autoresearch` command: one argparse tree, one module per command group.

Each module in this package defines ``register(subparsers)`` adding its group; a handler returns
an exit code. Errors the user can fix print one line on stderr and exit 2, through one path
(``main``): a ``SpecError`` (bad spec, SLA or option, unusable logs), an ``OSError`` about a path or
connection the user gave, and argparse's own usage errors (``OneLineParser``). SIGTERM ends a
command like Ctrl-C does, so half-built outputs (a pool's temp dir) are removed on the way out.
Commands of the Dagster layer (``autoresearch run``: jobs/main_job.py) register through the
``autoresearch.commands`` entry-point group, so the core never imports that layer.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import signal
import sys
from typing import NoReturn

from autoresearch_dagster.spec import SpecError

# command group -> module (kept explicit so --help order is stable)
_GROUPS = ["pool", "replay", "emulator", "noise", "experiment", "campaign", "correctness", "diagnose", "sql", "drafter"]
PLUGIN_GROUP = "autoresearch.commands"


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (subcommand parsers inherit the class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: str) -> str:
    return " | ".join(part.strip() for part in str(message).splitlines() if part.strip())


def user_error(e: BaseException) -> str:
    """The one line a user error prints."""
    if isinstance(e, OSError) and not isinstance(e, SpecError):
        where = f"{e.filename}: " if e.filename is not None else ""
        return one_line(f"{where}{e.strerror or e}")
    return one_line(str(e))


def check_api_key_env(name: str | None) -> None:
    """``--api-key-env NAME``: the variable must be set (and not empty) before anything runs."""
    if name is not None and not os.environ.get(name):
        raise SpecError(f"--api-key-env {name}: the environment variable {name} is not set (export the API key in it)")


def _terminate(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    previous = None
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        try:
            previous = signal.signal(signal.SIGTERM, _terminate)
        except ValueError:  # not the main thread: the caller owns signals
            pass
    try:
        return int(args.func(args) or 0)
    except (SpecError, OSError) as e:
        print(f"autoresearch: error: {user_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoresearch: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
