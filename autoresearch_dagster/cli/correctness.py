"""Owns `autoresearch correctness`: run the output-distribution gate (real endpoints or the emulator's tiny model)."""
from __future__ import annotations

import argparse
from pathlib import Path

from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.spec import SpecError, load_server_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("correctness", help="output-distribution gate for lossy changes",
                       description="Compares a candidate's next-token distributions with the baseline's on the "
                                   "same token sequences (teacher forcing through /v1/completions echo+logprobs), "
                                   "calibrated by an A/A run. See docs/correctness.md.")
    g = p.add_subparsers(dest="correctness_cmd", metavar="SUBCOMMAND", required=True)

    gate_p = g.add_parser("gate", help="gate a candidate endpoint against a baseline endpoint (same tokenizer)")
    gate_p.add_argument("--baseline", required=True, help="baseline base URL, e.g. http://127.0.0.1:30000")
    gate_p.add_argument("--candidate", required=True, help="candidate base URL")
    gate_p.add_argument("--model", help="model name sent in requests")
    gate_p.add_argument("--api-key-env", help="environment variable holding the API key")
    gate_p.add_argument("--positive-control", help="URL of a server known to be wrong (must fail)")
    _common(gate_p)
    gate_p.set_defaults(func=_handle_gate)

    emu_p = g.add_parser("emulate", help="the emulator's gate: the tiny torch model with each config's numerics")
    emu_p.add_argument("--baseline-config", help="baseline server config file (default: SGLang defaults)")
    emu_p.add_argument("--candidate-config", required=True, help="candidate server config file")
    _common(emu_p)
    emu_p.set_defaults(func=_handle_emulate)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tolerance", choices=["strict", "near_lossless"], default="near_lossless")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--prompts-per-bucket", type=int, default=3, help="prompts in each of the six buckets")
    p.add_argument("--long-chars", type=int, default=600, help="length of the long-context prompts")
    p.add_argument("--gen-tokens", type=int, default=32, help="greedy continuation scored after each prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="directory for correctness.json")


def _report(res, out: str | None) -> int:
    verdict = "PASS" if res.passed else "FAIL"
    print(f"{verdict}: top-1 agreement {res.top1_agreement:.4f}, mean KL {res.kl_mean:.3g} nats "
          f"(p99 {res.kl_p99:.3g}, threshold {res.threshold:.3g}), mean TV {res.tv_mean:.4f}, "
          f"{res.n_positions} positions, A/A KL {res.calibration.get('kl_mean', 0):.3g}, method {res.method}")
    for r in res.reasons:
        print(f"  - {r}")
    if out:
        path = write_json(Path(out) / "correctness.json", res.to_dict(), sort_keys=True)
        print(f"wrote {path}")
    return 0 if res.passed else 1


def _prompts(args: argparse.Namespace):
    from autoresearch_dagster.correctness import prompt_set

    if args.prompts_per_bucket < 1 or args.long_chars < 1:
        raise SpecError("--prompts-per-bucket and --long-chars must be positive")
    return prompt_set(args.prompts_per_bucket, long_chars=args.long_chars)


def _handle_gate(args: argparse.Namespace) -> int:
    from autoresearch_dagster.cli import check_api_key_env
    from autoresearch_dagster.correctness import GateError, gate

    check_api_key_env(args.api_key_env)
    try:
        res = gate(args.baseline, args.candidate, _prompts(args), model=args.model, top_k=args.top_k,
                   gen_tokens=args.gen_tokens, tolerance=args.tolerance, api_key_env=args.api_key_env,
                   positive_control_url=args.positive_control, seed=args.seed)
    except GateError as e:
        raise SpecError(f"the gate could not measure: {e}") from None
    return _report(res, args.out)


def _handle_emulate(args: argparse.Namespace) -> int:
    from autoresearch_dagster.correctness import emulated_gate

    base = load_server_config(args.baseline_config) if args.baseline_config else {}
    cand = load_server_config(args.candidate_config)
    res = emulated_gate(base, cand, seed=args.seed, prompts=_prompts(args), tolerance=args.tolerance,
                        top_k=args.top_k, gen_tokens=args.gen_tokens)
    return _report(res, args.out)
