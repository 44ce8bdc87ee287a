"""Owns the `autoresearch pool` command group: build a replay pool from logs, re-print its fidelity report."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoresearch_dagster.logs.timeline import DAY_S, TimelineLimits
from autoresearch_dagster.pool.fidelity import format_brief, format_report
from autoresearch_dagster.spec import SpecError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("pool", help="build and inspect replay pools",
                              description="Replay pools: redacted requests with arrival offsets, built from logs.")
    sub = p.add_subparsers(dest="pool_command", metavar="SUBCOMMAND")
    b = sub.add_parser("build", help="build a redacted replay pool from request logs or token traces",
                       description="Reads logs (OpenAI chat JSONL, Mooncake JSONL, Azure CSV, BurstGPT CSV), "
                                   "quarantines bad records, redacts PII, writes DIR/replay_pool.parquet, "
                                   "DIR/fidelity.json, DIR/quarantine.jsonl, DIR/summary.json (and "
                                   "DIR/blocks.parquet for traces). Redaction key: $AUTORESEARCH_REDACTION_KEY.")
    b.add_argument("--logs", required=True, nargs="+", metavar="PATH", help="log file(s), read in the order given")
    b.add_argument("--endpoint", required=True, metavar="NAME", help="endpoint the pool belongs to")
    b.add_argument("--out", required=True, metavar="DIR", help="pool directory (replaced atomically)")
    b.add_argument("--format", default="auto", choices=["auto", "openai", "mooncake", "azure", "burstgpt"],
                   help="force the input format (default: detect from the first record)")
    b.add_argument("--tokenizer", metavar="PATH", help="Hugging Face tokenizer.json for exact token counts")
    b.add_argument("--max-records", type=int, metavar="N", help="read at most N records")
    b.add_argument("--workers", type=int, metavar="N", help="worker processes for chat logs (default: auto)")
    b.add_argument("--context-length", type=int, metavar="TOKENS",
                   help="the served model's context: prompts that leave no room for an output token are quarantined "
                        "(default: no check)")
    b.add_argument("--max-span-days", type=float, metavar="DAYS", default=TimelineLimits.max_span_s / DAY_S,
                   help="longest timeline a pool may span; records beyond it are quarantined (default %(default)g)")
    b.add_argument("--max-gap-days", type=float, metavar="DAYS", default=TimelineLimits.max_gap_s / DAY_S,
                   help="largest gap between a record and the rest of the timeline; records further out are "
                        "quarantined as timestamp outliers (default %(default)g)")
    b.set_defaults(func=_build)
    f = sub.add_parser("fidelity", help="print the fidelity report of a built pool")
    f.add_argument("--pool", required=True, metavar="DIR", help="pool directory (or its replay_pool.parquet)")
    f.add_argument("--json", action="store_true", help="print the report as JSON")
    f.set_defaults(func=_fidelity)
    a = sub.add_parser("adapt", help="adapt a pool to an endpoint's limits and write it as a pool of its own",
                       description="Applies the endpoint's engine_options.adapt_pool limits (max_model_len, "
                                   "max_output_tokens, strip_tools, strip_sampling; see pool/adapt.py) to every "
                                   "request and writes the result to DIR with the changes counted in its meta "
                                   "(adaptation) and the source pool's hash (adapted_from).")
    a.add_argument("--pool", required=True, metavar="DIR", help="source pool directory")
    a.add_argument("--endpoint", required=True, metavar="FILE", help="endpoint spec whose adapt_pool limits apply")
    a.add_argument("--out", required=True, metavar="DIR", help="adapted pool directory (replaced atomically)")
    a.set_defaults(func=_adapt)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def _adapt(args: argparse.Namespace) -> int:
    from autoresearch_dagster.pool.adapt import AdaptedPool, limits_from_options, write_adapted
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.spec import load_endpoint

    endpoint = load_endpoint(args.endpoint)
    limits = limits_from_options(endpoint)
    if limits is None:
        raise SpecError(f"endpoint {endpoint.name!r} sets no engine_options.adapt_pool: nothing to adapt")
    try:
        source = read_pool(args.pool)
    except FileNotFoundError as e:
        raise SpecError(str(e)) from None
    out = write_adapted(source, limits, Path(args.out))
    print(AdaptedPool(source, limits).summary())
    print(f"pool {out.path} ({len(list(out.iter_requests(None)))} requests; adapted from {source.content_hash})")
    return 0


def _build(args: argparse.Namespace) -> int:
    from autoresearch_dagster.pool.build import build_pool

    if args.max_records is not None and args.max_records <= 0:
        raise SpecError("--max-records must be positive")
    if args.workers is not None and args.workers < 1:
        raise SpecError(f"--workers must be at least 1, got {args.workers}")
    if args.context_length is not None and args.context_length < 2:
        raise SpecError(f"--context-length must be at least 2 tokens, got {args.context_length}")
    if args.tokenizer and not Path(args.tokenizer).is_file():
        raise SpecError(f"--tokenizer {args.tokenizer} is not a file (a Hugging Face tokenizer.json)")
    if not args.max_span_days > 0 or not args.max_gap_days > 0:
        raise SpecError("--max-span-days and --max-gap-days must be positive")
    timeline = TimelineLimits(max_span_s=args.max_span_days * DAY_S, max_gap_s=args.max_gap_days * DAY_S)
    res = build_pool([Path(p) for p in args.logs], args.endpoint, Path(args.out), fmt=args.format,
                     tokenizer_path=args.tokenizer, max_records=args.max_records, workers=args.workers,
                     context_length=args.context_length, timeline=timeline)
    s = res.summary
    red = ", ".join(f"{k} {v}" for k, v in s["redactions"].items()) or "none"
    print(f"pool {res.pool_path}")
    print(f"  records: {s['rows_in']} read, {s['rows_accepted']} accepted, {s['rows_quarantined']} quarantined"
          + (f" (see {res.quarantine_path})" if s["rows_quarantined"] else ""))
    if s["duplicate_request_ids"]:
        print(f"  duplicate request ids: {s['duplicate_request_ids']} repeats quarantined (the first record of each kept)")
    for reason, n in list(s["quarantine_reasons"].items())[:5]:
        print(f"    {n} x {reason}")
    print(f"  redactions: {red}")
    print(f"  prompt tokens: {s['prompt_tokens_pool']} in pool vs {s['prompt_tokens_source']} in source "
          f"({100 * s['prompt_token_change']:+.3f}%), counter {s['token_counter']}")
    print(f"  splits: {s['splits']}; built in {s['build_seconds']} s")
    print(format_brief(res.fidelity))
    print(f"  details: autoresearch pool fidelity --pool {args.out}")
    return 0 if res.fidelity["passed"] else 1


def _fidelity(args: argparse.Namespace) -> int:
    p = Path(args.pool)
    d = p if p.is_dir() else p.parent
    path = d / "fidelity.json"
    if not path.exists():
        raise SpecError(f"no fidelity report at {path} (build the pool with `autoresearch pool build`)")
    report = json.loads(path.read_text())
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["passed"] else 1
