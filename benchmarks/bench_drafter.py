"""Drafter adaptation on the demo endpoint: acceptance length before/after and the emulated capacity gain.

Builds the demo's replay pool (redacted, as every pool) from its logs, runs the project's drafter
pipeline on it (``drafter.train.run_train``: a CPU stand-in target, a tiny byte-level base model
trained on generic chat then fine-tuned on the pool's ``training`` split; the *starting* drafter, an
EAGLE head trained for the base on generic chat only; the *adapted* one, trained further on the
target's own continuations of the training split) and prints, all measured here:

- mean acceptance length (tokens per target forward) of the starting vs the adapted drafter on a
  held-out slice of the training split and on the serving split, by draft position and by request
  type, with the ratio against the target (adapted >= 1.3x starting on held-out traffic);
- the correctness gate: every measured request's speculative output equals target-only decoding;
- acceptance on redacted vs original text (the demo logs redacted again, measured at the same window
  just after the first redacted span), for both drafters;
- the emulated capacity (req/s inside the SLA, the runner's capacity search on the virtual-time
  emulator) of the demo endpoint with speculative decoding off, with EAGLE at the starting drafter's
  measured acceptance and at the adapted drafter's (``engine_options.spec_acceptance``), under the
  demo SLA and under a tight TPOT SLA.

Usage: python benchmarks/bench_drafter.py [--quick] [--out DIR] [--workers 2]
Full run: the pipeline's default recipe plus 6 capacity searches at 60 s steps (2 to 6 minutes on 2
shared cores). ``--quick``: 150 head steps, 12 requests per slice, 16 tokens decoded per request, 20 s
capacity steps (about 1.5 minutes); its figures are noisier, the redaction deltas most of all.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.3  # adapted over starting mean acceptance length on held-out traffic
TIGHT_SLA = "ttft_p99<=3000ms,tpot_p99<=30ms,errors<=1%"
POOL_KEY = b"bench-drafter"  # a fixed redaction key: the same pseudonyms, conversation ids and split every run


def quick_settings():
    from autoresearch_dagster.drafter.settings import DrafterSettings

    return DrafterSettings(steps=150, target_steps=400, measure_requests=12, max_new=16)


def eagle_config(base: dict[str, Any], k: int) -> dict[str, Any]:
    """EAGLE as a chain of k draft tokens per verify step: the shape the drafter was measured at."""
    from autoresearch_dagster.spec import validate_server_config

    return validate_server_config({**base, "speculative_algorithm": "EAGLE", "speculative_num_steps": k,
                                   "speculative_eagle_topk": 1, "speculative_num_draft_tokens": k + 1})


def _capacity(endpoint_json: str, pool_path: str, config: dict[str, Any], step_s: float, seed: int) -> dict[str, Any]:
    from autoresearch_dagster.experiments.grid import GridSettings, measure_point
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.spec import EndpointSpec

    ep = EndpointSpec.model_validate_json(endpoint_json)
    return measure_point(ep, read_pool(pool_path), config, GridSettings(step_duration_s=step_s, seed=seed, workers=1))


def capacity_table(endpoint, pool_path: str | Path, acceptance: dict[str, Path], *, k: int, slas: dict[str, str],
                   step_s: float = 60.0, seed: int = 0, workers: int = 1,
                   log: Callable[[str], None] = print) -> dict[str, dict[str, dict[str, Any]]]:
    """Capacity per SLA for spec decoding off and EAGLE at each measured acceptance file.
    Returns ``{sla_name: {"off" | drafter: measure_point result}}``; all runs share seeds."""
    from autoresearch_dagster.spec import EndpointSpec

    base = dict(endpoint.server_config)
    jobs = []
    for sla_name, sla in slas.items():
        d = {**endpoint.model_dump(mode="json"), "sla": sla}
        jobs.append((sla_name, "off", EndpointSpec.model_validate(d), base))
        for name, path in acceptance.items():
            ep = EndpointSpec.model_validate({**d, "engine_options": {**endpoint.engine_options,
                                                                      "spec_acceptance": str(path)}})
            jobs.append((sla_name, name, ep, eagle_config(base, k)))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    args = [(ep.model_dump_json(), str(pool_path), cfg, step_s, seed) for _, _, ep, cfg in jobs]
    if workers <= 1:
        results = []
        for (sla_name, name, _, _), a in zip(jobs, args):
            results.append(_capacity(*a))
            log(f"  capacity [{sla_name}] {name}: {results[-1]['capacity_rps']:.2f} req/s "
                f"({results[-1]['wall_s']:.0f} s)")
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            futs = [ex.submit(_capacity, *a) for a in args]
            results = []
            for (sla_name, name, _, _), f in zip(jobs, futs):
                results.append(f.result())
                log(f"  capacity [{sla_name}] {name}: {results[-1]['capacity_rps']:.2f} req/s")
    for (sla_name, name, _, _), r in zip(jobs, results):
        out.setdefault(sla_name, {})[name] = r
    return out


def run_bench(logs: list[Path], out: Path, *, settings=None, capacity: bool = True, endpoint_path: Path | None = None,
              tight_sla: str = TIGHT_SLA, step_s: float = 60.0, workers: int = 1, max_records: int | None = None,
              threads: int | None = 1, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The benchmark's measurements as a dict (what ``main`` prints); ``capacity=False`` skips the emulator.
    ``threads``: torch's intra-op threads while the drafter trains and is measured (restored after; None
    leaves torch's default). One is the default: the models are tiny, and on shared cores torch's
    OpenMP threads wait on each other (30 target training steps took 51 s with 2 threads, 3.6 s with 1,
    on 2 cores at load average 10)."""
    import torch

    from autoresearch_dagster.pool.redact import KEY_ENV

    prev, prev_key = torch.get_num_threads(), os.environ.get(KEY_ENV)
    if threads:
        torch.set_num_threads(threads)
    # the pool's key for the re-redaction of the original logs too (the pipeline's Redactor reads it from
    # the environment): without it each run draws a random key, other pseudonyms and other windows
    os.environ[KEY_ENV] = POOL_KEY.decode()
    try:
        return _run_bench(logs, out, settings=settings, capacity=capacity, endpoint_path=endpoint_path,
                          tight_sla=tight_sla, step_s=step_s, workers=workers, max_records=max_records, log=log)
    finally:
        torch.set_num_threads(prev)
        if prev_key is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = prev_key


def _run_bench(logs: list[Path], out: Path, *, settings, capacity: bool, endpoint_path: Path | None, tight_sla: str,
               step_s: float, workers: int, max_records: int | None, log: Callable[[str], None]) -> dict[str, Any]:
    from autoresearch_dagster.drafter.settings import DrafterSettings
    from autoresearch_dagster.drafter.train import run_train
    from autoresearch_dagster.pool.build import build_pool
    from autoresearch_dagster.spec import load_endpoint

    s = settings or DrafterSettings()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    built = build_pool(logs, "demo", out / "pool", key=POOL_KEY, max_records=max_records)
    log(f"pool built (redacted) from {', '.join(p.name for p in logs)} in {time.perf_counter() - t0:.1f} s: "
        f"{built.pool_path}")
    t1 = time.perf_counter()
    rep = run_train(built.pool_path, out / "drafter", settings=s, original_logs=logs, log=log)
    res: dict[str, Any] = {"report": rep, "drafter_wall_s": round(time.perf_counter() - t1, 1),
                           "target_ratio": TARGET_RATIO}
    held = rep["acceptance"]["held_out"]
    res["ratio_held_out"] = held["adapted_over_starting"]
    res["target_met"] = bool(res["ratio_held_out"] is not None and res["ratio_held_out"] >= TARGET_RATIO)
    res["gate_passed"] = bool(rep["gate"]["passed"])
    if capacity:
        ep = load_endpoint(endpoint_path or ROOT / "examples/endpoints/demo.yaml")
        t2 = time.perf_counter()
        res["capacity"] = capacity_table(
            ep, built.pool_path, {"starting": out / "drafter" / "acceptance_starting.json",
                                  "adapted": out / "drafter" / "acceptance.json"},
            k=s.k, slas={"demo": str(ep.sla), "tight": tight_sla}, step_s=step_s, seed=s.seed, workers=workers,
            log=log)
        res["slas"] = {"demo": str(ep.sla), "tight": tight_sla}
        res["capacity_wall_s"] = round(time.perf_counter() - t2, 1)
    return res


def _fmt_pos(v: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in v)


def print_results(res: dict[str, Any]) -> None:
    rep = res["report"]
    acc = rep["acceptance"]
    k = rep["settings"]["k"]
    print()
    print(f"target: {rep['target']['kind']} (d_model {rep['target']['config']['d_model']}, "
          f"{rep['target']['config']['n_layers']} layers, fine-tune loss {rep['target'].get('final_loss')}); "
          f"k = {k} draft tokens per verify step, {rep['settings']['max_new']} tokens decoded per request")
    ts = rep["training_set"]
    print(f"training set: {ts['fit_requests']} fit requests -> {ts['sequences']} target sequences "
          f"(+{ts['hard_examples_redrawn']} hard examples); held out {ts['held_out_requests']} requests")
    print()
    print("mean acceptance length (tokens per target forward; 1.0 = no draft accepted, "
          f"{k + 1}.0 = all {k} accepted)")
    print(f"{'slice':10s} {'requests':>8s} {'starting':>9s} {'adapted':>9s} {'ratio':>7s}   "
          f"per-position acceptance starting | adapted")
    for sl in ("held_out", "serving"):
        a = acc[sl]
        st, ad = a["starting"], a["adapted"]
        print(f"{sl:10s} {ad['requests']:8d} {st['mean_accept_length']:9.3f} {ad['mean_accept_length']:9.3f} "
              f"{a['adapted_over_starting']:6.2f}x   {_fmt_pos(st['per_position'])} | {_fmt_pos(ad['per_position'])}")
    print()
    print("by request type (held-out | serving), starting -> adapted")
    kinds = sorted(set(acc["held_out"]["adapted"]["by_request_type"]) | set(acc["serving"]["adapted"]["by_request_type"]))
    for kind in kinds:
        cells = []
        for sl in ("held_out", "serving"):
            st = acc[sl]["starting"]["by_request_type"].get(kind)
            ad = acc[sl]["adapted"]["by_request_type"].get(kind)
            cells.append(f"{st['mean_accept_length']:.3f} -> {ad['mean_accept_length']:.3f} "
                         f"({ad['verify_steps']} steps)" if st and ad else "-")
        print(f"  {kind:12s} {cells[0]:28s} | {cells[1]}")
    print()
    verdict = "MET" if res["target_met"] else "NOT MET"
    print(f"held-out ratio adapted / starting: {res['ratio_held_out']:.2f}x (target >= {res['target_ratio']:.1f}x): {verdict}")
    mism = sum(acc[sl][n]["gate"]["mismatched_requests"] for sl in acc for n in ("starting", "adapted"))
    print(f"correctness gate (greedy speculative output == target-only decoding, every measured request): "
          f"{'PASSED' if res['gate_passed'] else 'FAILED'} ({mism} mismatched requests)")
    red = rep["redaction_effect"]
    print()
    if "skipped" in red:
        print(f"redacted vs original: skipped ({red['skipped']})")
    else:
        print(f"redacted vs original text: {red['pairs_measured']} windows of records redaction changed "
              f"({red['records_changed_by_redaction']} of {red['records_read']} read); {red['window']}")
        print(f"{'drafter':10s} {'original':>9s} {'redacted':>9s} {'delta':>7s} {'gate':>6s}")
        for name in ("starting", "adapted"):
            d = red["by_drafter"][name]
            ok = d["original"]["gate_passed"] and d["redacted"]["gate_passed"]
            print(f"{name:10s} {d['original']['mean_accept_length']:9.3f} {d['redacted']['mean_accept_length']:9.3f} "
                  f"{d['redacted_minus_original']:+7.3f} {'pass' if ok else 'FAIL':>6s}")
    if "capacity" in res:
        print()
        print(f"emulated capacity on the demo endpoint (req/s inside the SLA; EAGLE chain of {k} drafts at the "
              f"measured acceptance)")
        print(f"{'SLA':42s} {'spec off':>9s} {'starting':>9s} {'adapted':>9s} {'adapted/start':>13s} {'adapted/off':>11s}")
        for sla_name, row in res["capacity"].items():
            off, st, ad = (row[n]["capacity_rps"] for n in ("off", "starting", "adapted"))
            r1 = f"{ad / st:.2f}x" if st else "-"
            r2 = f"{ad / off:.2f}x" if off else "-"
            print(f"{res['slas'][sla_name]:42s} {off:9.2f} {st:9.2f} {ad:9.2f} {r1:>13s} {r2:>11s}")
            lim = ", ".join(f"{n}: {row[n]['limited_by'] or '-'}" for n in ("off", "starting", "adapted"))
            print(f"{'':42s} limited by {lim}")
        losses = [n for n, row in res["capacity"].items()
                  if row["off"]["capacity_rps"] > max(row["starting"]["capacity_rps"], row["adapted"]["capacity_rps"])]
        if losses:
            print(f"spec off beats both drafters under the {' and '.join(losses)} SLA: EAGLE caps running requests "
                  "(48 by default, as SGLang does) and spends draft compute, which costs more capacity than the "
                  "accepted tokens save when the SLA leaves room for large decode batches")


def main() -> None:
    from autoresearch_dagster.drafter.settings import DrafterSettings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", nargs="+", default=[str(ROOT / "examples/logs/demo_chat.jsonl")],
                    help="request logs with original content (default: the demo logs)")
    ap.add_argument("--endpoint", default=str(ROOT / "examples/endpoints/demo.yaml"))
    ap.add_argument("--quick", action="store_true", help="short recipe, 12 requests per slice, 20 s capacity steps")
    ap.add_argument("--no-capacity", action="store_true", help="skip the emulated capacity searches")
    ap.add_argument("--tight-sla", default=TIGHT_SLA, help=f"the tight SLA (default {TIGHT_SLA})")
    ap.add_argument("--step-s", type=float, help="capacity step duration (default 60, --quick 20)")
    ap.add_argument("--workers", type=int, default=2, help="capacity searches in parallel (spawned processes)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads for the drafter (default 1; 0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="working directory (default: a temporary directory)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    s = replace(quick_settings() if args.quick else DrafterSettings(), seed=args.seed)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-drafter-"))
    print(f"load average before: {os.getloadavg()}; working directory {out}", flush=True)
    t0 = time.perf_counter()
    res = run_bench([Path(p) for p in args.logs], out, settings=s, capacity=not args.no_capacity,
                    endpoint_path=Path(args.endpoint), tight_sla=args.tight_sla,
                    step_s=args.step_s or (20.0 if args.quick else 60.0), workers=args.workers,
                    threads=args.threads or None, log=lambda m: print(m, flush=True))
    print_results(res)
    print()
    print(f"wall {time.perf_counter() - t0:.0f} s (drafter {res['drafter_wall_s']:.0f} s"
          + (f", capacity {res['capacity_wall_s']:.0f} s" if "capacity_wall_s" in res else "")
          + f"); load average after: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
