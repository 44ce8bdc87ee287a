"""Redaction quality and speed, side by side with plain Microsoft Presidio in one run.

Quality: recall per entity type (an entity counts only when every letter and digit of it is covered;
"any" = any overlap) and precision (detected spans that touch no labelled entity are over-redaction)
on labelled corpora: Faker-templated support chat in 12 locales (the held-out template set; the dev
set that detector work was checked against is printed apart) and hand-written hard cases.
Speed: requests per second on one core over a chat log with realistic repetition (the demo log:
shared system prompts, multi-turn conversations that resend earlier turns, tool schemas), the
product's ``Redactor`` against Presidio's ``AnalyzerEngine`` analysing every text of every request.

Presidio runs in its default configuration (all predefined recognizers, spaCy NER) with the same
small English spaCy pipeline the product uses. Its ``tldextract`` dependency is pointed at the
suffix list bundled in the package (``TLDExtract(suffix_list_urls=())``), so it never fetches one.

Headline: an independent labelled corpus (``--corpus-dir``, default benchmarks/data/pii_independent:
``corpus.jsonl``, ``split.json``, ``hard_cases.jsonl``), written apart from every detector list and
rule, split once by hash into a development half (the only one detector work was tuned on) and a
report half. ``--half report`` (the default) is what is reported; ``--half dev`` is for tuning.
There throughput is characters per second on one core over the half's texts, each distinct (no
cache helps), the product's detector (``find_pii_many``, NER batched) beside Presidio's
``analyze`` per text. Every leak is printed with its type and its context in redacted form.

    .venv/bin/python benchmarks/bench_redaction.py [--half report|dev] [--corpus-dir DIR] [--n 400] [--requests 300]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core for both sides
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoresearch_dagster.pool.pii_detect import NER_MODEL  # noqa: E402
from autoresearch_dagster.pool.pii_eval import (KINDS, NEVER_LEAK, STRUCTURED, Sample, Score,  # noqa: E402
                                                faker_corpus, load_independent, load_marked, score)
from autoresearch_dagster.pool.redact import Redactor, find_pii, find_pii_many  # noqa: E402

HARD = ROOT / "benchmarks" / "data" / "pii_hard_cases.jsonl"
DEMO = ROOT / "examples" / "logs" / "demo_chat.jsonl"
INDEPENDENT = ROOT / "benchmarks" / "data" / "pii_independent"
TARGETS = {"structured": 0.99, "person": 0.90, "address": 0.85, "speedup": 10.0}
INDEPENDENT_TARGETS = {"structured": 0.995, "person": 0.90, "address": 0.85, "speedup": 10.0}
TUNED_ON = "dev"  # the half of the independent corpus detector work was checked against


def presidio_engine():
    import tldextract
    import tldextract.tldextract as tx
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider

    tx.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=())  # the bundled snapshot, no fetch
    nlp = NlpEngineProvider(nlp_configuration={
        "nlp_engine_name": "spacy", "models": [{"lang_code": "en", "model_name": NER_MODEL}]}).create_engine()
    return AnalyzerEngine(nlp_engine=nlp, supported_languages=["en"])


def ours(text: str) -> list[tuple[int, int]]:
    return [(a, b) for a, b, _, _ in find_pii(text)]


def table(name: str, sc_ours: Score, sc_peer: Score) -> list[str]:
    lines = [f"\n{name}", f"{'type':13s} {'n':>5s} {'ours':>7s} {'(any)':>7s} {'presidio':>9s} {'(any)':>7s}  leaks (ours)"]
    for k in KINDS:
        if not sc_ours.total.get(k):
            continue
        leaks = sc_ours.leaks.get(k, [])
        lines.append(f"{k:13s} {sc_ours.total[k]:5d} {sc_ours.recall(k):7.1%} {sc_ours.any_overlap(k):7.1%} "
                     f"{sc_peer.recall(k):9.1%} {sc_peer.any_overlap(k):7.1%}  "
                     + (f"{len(leaks)}: " + ", ".join(repr(x) for x in leaks[:3]) if leaks else ""))
    lines.append(f"{'precision':13s} {'':5s} {sc_ours.precision:7.1%} {'':7s} {sc_peer.precision:9.1%}   "
                 f"(over-redacted spans: ours {sc_ours.false_spans}, presidio {sc_peer.false_spans})")
    return lines


def merged(*scores: Score) -> Score:
    out = Score()
    for sc in scores:
        for attr in ("total", "caught", "touched"):
            d = getattr(out, attr)
            for k, v in getattr(sc, attr).items():
                d[k] = d.get(k, 0) + v
        for k, v in sc.leaks.items():
            out.leaks.setdefault(k, []).extend(v)
        out.detected += sc.detected
        out.false_spans += sc.false_spans
    return out


def throughput(requests: list[dict], engine) -> tuple[float, float, int]:
    """(ours req/s, presidio req/s, texts per request on average)."""
    texts_per = []

    def texts(req: dict) -> list[str]:
        out = []
        for m in req.get("messages") or []:
            c = m.get("content")
            if isinstance(c, str):
                out.append(c)
            elif isinstance(c, list):
                out.extend(p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
            for call in m.get("tool_calls") or []:
                out.append(call.get("function", {}).get("arguments", ""))
        if req.get("tools"):
            out.append(json.dumps(req["tools"]))
        return [t for t in out if t]

    r = Redactor(b"bench-key")
    t0 = time.perf_counter()
    for req in requests:
        r.redact_messages(req.get("messages") or [])
        if req.get("tools"):
            r.redact_json(req["tools"])
    ours_rps = len(requests) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for req in requests:
        ts = texts(req)
        texts_per.append(len(ts))
        for t in ts:
            engine.analyze(text=t, language="en")
    peer_rps = len(requests) / (time.perf_counter() - t0)
    return ours_rps, peer_rps, round(sum(texts_per) / max(1, len(texts_per)))


def redacted_context(text: str, a: int, b: int, width: int = 60) -> str:
    """The text around a leak with everything the product did detect replaced by its surrogate, the
    leaked value marked with >>...<<."""
    r = Redactor(b"bench-context")
    lo, hi = max(0, a - width), min(len(text), b + width)
    parts, pos = [], lo
    for s0, e0, kind, norm in find_pii(text):
        if e0 <= lo or s0 >= hi:
            continue
        s0, e0 = max(s0, lo), min(e0, hi)
        if s0 < pos:
            continue
        parts.append(_mark(text, pos, s0, a, b))
        parts.append(r.surrogate(kind, text[s0:e0], norm) if not (s0 < b and a < e0) else f"[{text[s0:e0]}]")
        pos = e0
    parts.append(_mark(text, pos, hi, a, b))
    return ("…" if lo else "") + "".join(parts).replace("\n", "⏎") + ("…" if hi < len(text) else "")


def _mark(text: str, s0: int, e0: int, a: int, b: int) -> str:
    seg = text[s0:e0]
    if s0 <= a < e0 or s0 < b <= e0 or (a <= s0 and e0 <= b):
        i, j = max(a, s0) - s0, min(b, e0) - s0
        seg = seg[:i] + ">>" + seg[i:j] + "<<" + seg[j:]
    return seg


def structured_recall(sc: Score) -> tuple[float, int, int]:
    kinds = [k for k in STRUCTURED if sc.total.get(k)]
    n = sum(sc.total[k] for k in kinds)
    caught = sum(sc.caught.get(k, 0) for k in kinds)
    return (caught / n if n else 1.0), n - caught, n


def independent(args, engine, peer) -> list[tuple[str, bool]]:
    corpus, hard = load_independent(args.corpus_dir, args.half)
    samples = corpus + hard
    texts = [s.text for s in samples]
    nch = sum(map(len, texts))
    print(f"\nINDEPENDENT CORPUS ({args.corpus_dir}), {args.half} half: {len(corpus)} records + "
          f"{len(hard)} hard cases, {nch} chars; detectors tuned on the {TUNED_ON} half only"
          + ("  ** THIS IS THE TUNING HALF, NOT A REPORT **" if args.half == TUNED_ON else ""))
    find_pii_many(texts[:8])  # model loaded before timing
    t0 = time.perf_counter()
    ours_spans = find_pii_many(texts)
    ours_s = time.perf_counter() - t0
    by_text = {t: [(a, b) for a, b, _, _ in sp] for t, sp in zip(texts, ours_spans)}
    t0 = time.perf_counter()
    peer_spans = {t: peer(t) for t in texts}
    peer_s = time.perf_counter() - t0
    results = {}
    for name, part in (("corpus", corpus), ("hard cases", hard), ("corpus + hard cases", samples)):
        if not part:
            continue
        results[name] = (score(part, by_text.__getitem__), score(part, peer_spans.__getitem__))
        for line in table(f"independent {args.half} half, {name}: {len(part)} records", *results[name]):
            print(line)
    sc, sc_peer = results["corpus + hard cases"]
    rec, leaked, n_struct = structured_recall(sc)
    prec_p, leaked_p, _ = structured_recall(sc_peer)
    print(f"structured identifiers: ours {rec:.2%} ({leaked} of {n_struct} leak), presidio {prec_p:.2%} "
          f"({leaked_p} leak)")
    if os.environ.get("AUTORESEARCH_REDACTION_ORGS", "0") != "1":
        print("(organisations are redacted only with AUTORESEARCH_REDACTION_ORGS=1, the product's opt-in; "
              "their row shows the default)")
    print(f"\nleaks (ours), {len(sc.leak_sites)}, type and context in redacted form (>>leak<<):")
    for kind, text, a, b in sorted(sc.leak_sites, key=lambda x: x[0]):
        print(f"  {kind:12s} {redacted_context(text, a, b)}")
    ours_cps, peer_cps = nch / ours_s, nch / peer_s
    speed = ours_cps / peer_cps
    print(f"\nthroughput on the {args.half} half's {len(texts)} distinct texts, one core:")
    print(f"  ours      {ours_cps:10.0f} chars/s")
    print(f"  presidio  {peer_cps:10.0f} chars/s")
    print(f"  ratio     {speed:10.1f}x")
    t = INDEPENDENT_TARGETS
    return [
        (f"[independent {args.half}] structured identifiers >= {t['structured']:.1%} ({rec:.2%}, {leaked} leaks)",
         rec >= t["structured"]),
        (f"[independent {args.half}] person names >= {t['person']:.0%} ({sc.recall('person') or 0:.1%})",
         (sc.recall("person") or 0) >= t["person"]),
        (f"[independent {args.half}] addresses >= {t['address']:.0%} ({sc.recall('address') or 0:.1%})",
         (sc.recall("address") or 0) >= t["address"]),
        (f"[independent {args.half}] throughput >= {t['speedup']:.0f}x presidio in chars/s ({speed:.1f}x)",
         speed >= t["speedup"]),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400, help="Faker-templated messages per template set (regression)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--requests", type=int, default=300, help="demo-log requests timed for both")
    ap.add_argument("--corpus-dir", type=Path, default=INDEPENDENT, help="the independent labelled corpus")
    ap.add_argument("--half", choices=("report", "dev"), default="report",
                    help=f"which half of the independent corpus to score (tuning is done on {TUNED_ON!r})")
    ap.add_argument("--skip-faker", action="store_true", help="the independent corpus only")
    args = ap.parse_args()

    t0 = time.perf_counter()
    engine = presidio_engine()
    print(f"presidio analyzer ready in {time.perf_counter() - t0:.1f} s "
          f"(default recognizers, spaCy {NER_MODEL}; tldextract offline)")

    def peer(text: str) -> list[tuple[int, int]]:
        return [(r.start, r.end) for r in engine.analyze(text=text, language="en")]

    checks: list[tuple[str, bool]] = []
    if (args.corpus_dir / "split.json").exists():
        checks += independent(args, engine, peer)
    else:
        print(f"\n(no independent corpus at {args.corpus_dir}: its section is skipped)")
    if args.skip_faker:
        print()
        for text, ok in checks:
            print(f"target: {text}: {'met' if ok else 'NOT met'}")
        return 0
    print("\nREGRESSION: Faker-templated corpus and the earlier hand-written hard cases (not the headline)")

    corpora: dict[str, list[Sample]] = {
        "held-out (Faker templates, 12 locales)": faker_corpus(args.n, split="heldout", seed=args.seed),
        "hand-written hard cases": load_marked(HARD),
        "dev (the set detector work was checked on)": faker_corpus(args.n, split="dev", seed=args.seed),
    }
    results = {}
    for name, samples in corpora.items():
        results[name] = (score(samples, ours), score(samples, peer))
        for line in table(f"{name}: {len(samples)} messages", *results[name]):
            print(line)

    report = merged(*(results[n][0] for n in list(corpora)[:2]))
    peer_report = merged(*(results[n][1] for n in list(corpora)[:2]))
    for line in table("reported (held-out + hard cases)", report, peer_report):
        print(line)

    requests = [json.loads(line)["request"] for line in DEMO.read_text().splitlines()[:args.requests]]
    ours_rps, peer_rps, per = throughput(requests, engine)
    print(f"\nthroughput on {len(requests)} demo-log requests ({per} texts each on average), one core:")
    print(f"  ours      {ours_rps:8.1f} req/s")
    print(f"  presidio  {peer_rps:8.1f} req/s")
    speedup = ours_rps / peer_rps
    print(f"  ratio     {speedup:8.1f}x")

    structured = [k for k in STRUCTURED if report.total.get(k)]
    worst = min(structured, key=report.recall)
    leaks = {k: len(report.leaks.get(k, [])) for k in NEVER_LEAK if report.total.get(k)}
    checks += [
        (f"[faker regression] structured identifiers >= {TARGETS['structured']:.0%} (worst: {worst} {report.recall(worst):.1%})",
         report.recall(worst) >= TARGETS["structured"]),
        (f"[faker regression] zero leaks of {', '.join(leaks)} ({sum(leaks.values())} leaked)", sum(leaks.values()) == 0),
        (f"[faker regression] person names >= {TARGETS['person']:.0%} ({report.recall('person'):.1%})",
         report.recall("person") >= TARGETS["person"]),
        (f"[faker regression] street addresses >= {TARGETS['address']:.0%} ({report.recall('address'):.1%})",
         report.recall("address") >= TARGETS["address"]),
        (f"[demo log] throughput >= {TARGETS['speedup']:.0f}x presidio per core in req/s ({speedup:.1f}x)", speedup >= TARGETS["speedup"]),
    ]
    print()
    for text, ok in checks:
        print(f"target: {text}: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
