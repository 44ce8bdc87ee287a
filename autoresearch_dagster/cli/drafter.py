"""Owns `autoresearch drafter train`: adapt a speculative-decoding drafter to an endpoint's pool.

Builds the training set from the pool's ``training`` split (never the serving split), writes
OUT/coverage.json (training vs serving coverage), obtains the target (a saved TinyLM, or with
``tiny`` / no --target a CPU stand-in: a tiny base model trained on generic chat and fine-tuned on
the training split), trains the starting drafter (the stock-drafter analogue, generic chat only)
and the adapted one (the target's own outputs on the training split, disagreement weighted),
measures both by real speculative decoding with the greedy gate on a held-out slice of the training
split and on the serving split, and writes OUT/acceptance_report.json, OUT/acceptance.json (the
adapted drafter's measured distribution on the serving split, for ``engine_options.spec_acceptance``)
and OUT/acceptance_starting.json. --original-logs adds acceptance on original vs redacted text.
"""
from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from autoresearch_dagster.drafter.settings import DrafterSettings

    d = DrafterSettings()
    p = subparsers.add_parser("drafter", help="train a speculative drafter on a pool and measure its acceptance",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="drafter_cmd", metavar="ACTION", required=True)
    t = sub.add_parser("train", help="starting vs adapted drafter: training set, training, acceptance report",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--pool", required=True, help="replay pool (directory or replay_pool.parquet)")
    t.add_argument("--target", default="tiny",
                   help="saved TinyLM (.pt) to draft for, or 'tiny' (default): the CPU stand-in target")
    t.add_argument("--out", required=True, help="output directory")
    t.add_argument("--steps", type=int, default=d.steps, help=f"head training steps (default {d.steps})")
    t.add_argument("--depth", type=int, default=d.depth, help=f"draft head layers (default {d.depth})")
    t.add_argument("--lr", type=float, default=d.lr, help=f"head learning rate (default {d.lr:g})")
    t.add_argument("--k", type=int, default=d.k, help=f"draft tokens per verify step (default {d.k})")
    t.add_argument("--hard-weight", type=float, default=d.hard_weight,
                   help=f"disagreement weighting of hard examples and rejected positions (default {d.hard_weight:g})")
    t.add_argument("--target-steps", type=int, default=d.target_steps,
                   help=f"CPU stand-in target: fine-tuning steps (default {d.target_steps})")
    t.add_argument("--measure-requests", type=int, default=d.measure_requests,
                   help=f"requests measured per slice (default {d.measure_requests})")
    t.add_argument("--max-new", type=int, default=d.max_new, help=f"tokens decoded per measured request (default {d.max_new})")
    t.add_argument("--original-logs", nargs="+",
                   help="the logs the pool was built from: acceptance on original vs redacted text")
    t.add_argument("--seed", type=int, default=d.seed)
    t.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from autoresearch_dagster.drafter.settings import DrafterSettings
    from autoresearch_dagster.drafter.train import run_train
    from autoresearch_dagster.spec import SpecError

    for name in ("steps", "depth", "k", "target_steps", "measure_requests", "max_new"):
        if getattr(args, name) < 1:
            raise SpecError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.lr <= 0 or args.hard_weight < 0:
        raise SpecError("--lr must be positive and --hard-weight non-negative")
    s = DrafterSettings(steps=args.steps, depth=args.depth, lr=args.lr, k=args.k, hard_weight=args.hard_weight,
                        target_steps=args.target_steps, measure_requests=args.measure_requests,
                        max_new=args.max_new, seed=args.seed)
    rep = run_train(args.pool, args.out, target=args.target, settings=s, original_logs=args.original_logs)
    return 0 if rep["gate"]["passed"] else 1
