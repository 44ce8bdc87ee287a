"""Owns ``autoresearch drafter train``'s work: pool -> training set -> starting and adapted drafters ->
acceptance report and the acceptance file the emulator reads.

The training split is cut by conversation into a fit slice (the drafter's and, for the CPU stand-in,
the target's training text) and a held-out slice (measurement only); the serving split is measured,
never trained on. The *starting* drafter is the analogue of a stock drafter trained on generic chat
for the base model, then served with the post-trained target: an EAGLE head trained by the same
recipe on the base's continuations of a generic chat corpus generated here (no pool text in it).
The CPU stand-in target is that base fine-tuned on the fit slice; a loaded target comes without a
base, and its starting drafter is trained on the target's own generic-chat continuations (the
stock drafter's best case). The *adapted* drafter continues from the starting one on
the target's continuations of the fit slice, with hard examples (sequences where the starting
drafter disagrees with the target most) drawn again and positions where the target would reject
the draft weighted up. Both are measured by real speculative decoding with the greedy gate.

Redaction: the pool keeps only redacted content, so redacted-vs-original acceptance needs the
original logs (``original_logs``); each record's content is redacted again with the pool's
redactor and both versions are measured at the same window, ending just after the first redacted
span. Without original logs the comparison is skipped and the report says so.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from autoresearch_dagster.drafter.eagle import EagleHead, HeadRecipe, save_head, target_sequences, train_head
from autoresearch_dagster.drafter.model import LMConfig, TinyLM, encode, load_lm, save_lm, train_lm
from autoresearch_dagster.drafter.settings import DrafterSettings
from autoresearch_dagster.drafter.pipeline import (TrafficText, acceptance_distribution, coverage,
                                                   disagreement_weights, measure, request_text, traffic_texts,
                                                   weighted_sample)
from autoresearch_dagster.drafter.speculative import AcceptanceStats, speculative_generate
from autoresearch_dagster.outputs.files import write_json
from autoresearch_dagster.spec import SpecError

TINY_TARGET = "tiny"

# A generic chat corpus with no endpoint's traffic in it: the stock drafter's training text.
_SUBJECTS = ["my cat", "the weather", "a birthday cake", "the garden", "our trip to the coast", "a new phone",
             "the football match", "my homework", "a pasta recipe", "the museum", "a good book", "the movie"]
_ASKS = ["Can you tell me about", "What do you think of", "Help me plan", "Write a short poem about",
         "Give me three ideas for", "Explain simply", "How do I start with", "Tell a joke about"]
_REPLIES = ["Sure! Here is a friendly overview.", "Great question, let us think it through step by step.",
            "Of course. First, gather what you need.", "Happy to help with that today.",
            "Here are a few fun suggestions you might enjoy."]
_FILLER = ["It is sunny and warm", "you could try it slowly", "many people like this", "it takes about an hour",
           "remember to have fun", "ask a friend to join", "keep a small notebook", "start with something easy",
           "the colours are lovely", "bring water and snacks"]


def generic_corpus(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [f"User: {rng.choice(_ASKS)} {rng.choice(_SUBJECTS)}?", f"Assistant: {rng.choice(_REPLIES)}"]
        parts += [rng.choice(_FILLER).capitalize() + "." for _ in range(rng.randint(2, 5))]
        out.append(" ".join(parts))
    return out


def recipe(s: DrafterSettings, **kw: Any) -> HeadRecipe:
    return replace(HeadRecipe(depth=s.depth, lr=s.lr, steps=s.steps, seed=s.seed), **kw)


def _bucket(key: str) -> int:
    # salted: the pool's split hashes the same conversation keys, unsalted
    return int.from_bytes(hashlib.blake2b(b"drafter-heldout:" + key.encode(), digest_size=8).digest(), "big") % 100


def rebind(head: EagleHead, target: TinyLM) -> EagleHead:
    """The same head weights drafting for another target (a fine-tune of the model it was trained for)."""
    out = EagleHead(target, head.depth)
    out.load_state_dict(head.state_dict())
    out.eval()
    return out


def split_heldout(texts: list[TrafficText], percent: int) -> tuple[list[TrafficText], list[TrafficText]]:
    """(fit, held-out) by conversation, so no conversation's shared prefix sits on both sides."""
    held = [t for t in texts if _bucket(t.conversation or t.id) < percent]
    fit = [t for t in texts if _bucket(t.conversation or t.id) >= percent]
    return fit, held


def _sample(texts: list[TrafficText], n: int, seed: int) -> list[TrafficText]:
    return texts if len(texts) <= n else sorted(random.Random(seed).sample(texts, n), key=lambda t: t.id)


def _windows(texts: list[str], n: int, min_len: int, seed: int) -> list[str]:
    """Each text cut at up to ``n`` points (the last one its end): more training windows per request."""
    rng = random.Random(seed)
    out = []
    for t in texts:
        out.append(t)
        b = t.encode("utf-8")
        for _ in range(n - 1):
            if len(b) > 2 * min_len:
                out.append(b[:rng.randrange(min_len, len(b))].decode("utf-8", errors="ignore"))
    return out


def obtain_target(target: str | None, fit: list[TrafficText], s: DrafterSettings, *,
                  cache_dir: str | Path | None = None) -> tuple[TinyLM, TinyLM | None, dict]:
    """(target, base, description). A saved TinyLM has no base. ``tiny`` / None builds the CPU
    stand-in of a post-trained model: a base TinyLM trained on generic chat, then fine-tuned on the fit
    slice of the training split (the endpoint's traffic). ``cache_dir``: a stand-in built from the same fit
    slice and settings before (a campaign's rehearsal, then its full run) is loaded from there, as a
    served model would be, instead of trained again."""
    if target and target != TINY_TARGET:
        model = load_lm(target)
        return model, None, {"kind": "loaded", "path": str(target), "config": asdict(model.cfg)}
    cfg = LMConfig(d_model=64, n_layers=2, n_heads=4,
                   max_len=max(128, s.prompt_len + max(s.new_tokens, s.max_new + s.k + 1) + 8))
    key = hashlib.sha256(json.dumps({"cfg": asdict(cfg), "steps": s.target_steps, "seed": s.seed,
                                     "fit": [t.text for t in fit]}, sort_keys=True).encode()).hexdigest()[:16]
    cached = Path(cache_dir) / f"stand_in-{key}.json" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        info = json.loads(cached.read_text())
        return (load_lm(cached.with_suffix(".target.pt")), load_lm(cached.with_suffix(".base.pt")),
                {**info, "cached": str(cached)})
    t0 = time.perf_counter()
    base, base_loss = train_lm(generic_corpus(seed=s.seed + 1), cfg, steps=max(1, s.target_steps // 2),
                               seq_len=64, batch=32, seed=s.seed)
    model, loss = train_lm([t.text for t in fit], cfg, steps=s.target_steps, seq_len=64, batch=32, seed=s.seed,
                           init=base)
    info = {
        "kind": "cpu_stand_in", "config": asdict(cfg), "base_steps": max(1, s.target_steps // 2),
        "base_final_loss": round(base_loss, 4), "fine_tune_steps": s.target_steps, "final_loss": round(loss, 4),
        "wall_s": round(time.perf_counter() - t0, 1),
        "note": "CPU stand-in for the served post-trained model: a tiny byte-level transformer (the base) "
                "trained on generic chat text, then fine-tuned on the fit slice of the training split"}
    if cached is not None:
        save_lm(model, cached.with_suffix(".target.pt"))
        save_lm(base, cached.with_suffix(".base.pt"))
        write_json(cached, info, sort_keys=True)  # last: its presence means both models are whole
    return model, base, info


@torch.no_grad()
def _measure_pairs(target: TinyLM, heads: dict, pairs: list[tuple[list[int], list[int]]], s: DrafterSettings) -> dict:
    out, refs = {}, {}
    for name, head in heads.items():
        rep = {}
        for side in (0, 1):
            st, mism = AcceptanceStats(s.k), 0
            for i, pr in enumerate(pairs):
                toks, one = speculative_generate(target, head, pr[side], s.max_new, s.k, 0.0, None, target.cfg.max_len)
                if (i, side) not in refs:
                    refs[i, side] = target.generate(pr[side], s.max_new)
                mism += toks != refs[i, side]
                st.add(one)
            rep["original" if side == 0 else "redacted"] = {**st.to_dict(), "gate_passed": mism == 0}
        rep["redacted_minus_original"] = round(rep["redacted"]["mean_accept_length"]
                                               - rep["original"]["mean_accept_length"], 4)
        out[name] = rep
    return out


def redaction_effect(original_logs: list[str | Path], target: TinyLM, heads: dict, s: DrafterSettings,
                     key: bytes | None = None, max_records: int = 2000) -> dict:
    """Acceptance on original vs re-redacted text of the records whose content redaction changes."""
    from autoresearch_dagster.logs import read_records
    from autoresearch_dagster.logs.records import LogRecord
    from autoresearch_dagster.pool.redact import Redactor

    red = Redactor(key)
    pairs: list[tuple[list[int], list[int]]] = []
    seen = changed = 0
    for path in original_logs:
        for rec in read_records(path):
            if seen >= max_records or len(pairs) >= s.measure_requests:
                break
            if not isinstance(rec, LogRecord) or rec.kind != "chat":
                continue
            seen += 1
            a = encode(_record_text(rec, None))
            b = encode(_record_text(rec, red))
            if a == b or not a:
                continue
            changed += 1
            d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            end = min(d + 8, len(a), len(b))
            start = max(0, end - s.prompt_len)
            if end - start < 8:
                continue
            pairs.append((a[start:end], b[start:end]))
    if not pairs:
        return {"skipped": f"redaction changed none of the {seen} records read from the original logs"}
    return {"records_read": seen, "records_changed_by_redaction": changed, "pairs_measured": len(pairs),
            "window": f"the {s.prompt_len} bytes ending 8 bytes after the first redacted byte",
            "by_drafter": _measure_pairs(target, heads, pairs, s)}


def _record_text(rec, redactor) -> str:
    if redactor is None:
        return request_text(rec)
    return request_text(SimpleNamespace(
        api=rec.api, prompt=None if rec.prompt is None else redactor.redact_text(rec.prompt),
        messages=None if rec.messages is None else redactor.redact_messages(rec.messages)))


def run_train(pool_path: str | Path, out_dir: str | Path, *, target: str | None = None,
              settings: DrafterSettings = DrafterSettings(), original_logs: list[str | Path] | None = None,
              log=print, target_cache: str | Path | None = None) -> dict:
    from autoresearch_dagster.pool.schema import read_pool

    s = settings
    t0 = time.perf_counter()
    torch.manual_seed(s.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pool = read_pool(pool_path)
    training, serving = traffic_texts(pool, "training"), traffic_texts(pool, "serving")
    if not training:
        raise SpecError(f"pool {pool.path} has no requests with text in its training split")
    fit, held = split_heldout(training, s.heldout_percent)
    if not fit or not held:
        raise SpecError(f"the training split's {len(training)} requests leave an empty fit or held-out slice "
                        f"at {s.heldout_percent}% held out")
    cov = coverage(training, serving)
    write_json(out / "coverage.json", cov, sort_keys=True)
    log(f"training split: {len(training)} requests ({len(fit)} fit, {len(held)} held out); serving: {len(serving)}")

    model, base, target_info = obtain_target(target, fit, s, cache_dir=target_cache)
    if base is not None:
        save_lm(model, out / "target.pt")
        log(f"target: CPU stand-in, a base TinyLM trained on generic chat then fine-tuned {s.target_steps} steps "
            f"on the fit slice (loss {target_info['final_loss']}) -> {out / 'target.pt'}")
    need = s.prompt_len + max(s.new_tokens, s.max_new + s.k + 1)
    if need > model.cfg.max_len:
        raise SpecError(f"prompt_len + decode length ({need}) exceeds the target's max_len {model.cfg.max_len}")

    # the stock drafter: trained for the base model on generic chat (the target's own generic-chat
    # continuations when the target comes without a base), then served with the target
    stock = base if base is not None else model
    generic_base = target_sequences(stock, generic_corpus(seed=s.seed), s.prompt_len, s.new_tokens, seed=s.seed)
    stock_head, start_log = train_head(stock, generic_base, recipe(s))
    starting = rebind(stock_head, model)
    generic = (generic_base if base is None else
               target_sequences(model, generic_corpus(seed=s.seed), s.prompt_len, s.new_tokens, seed=s.seed))
    log(f"starting drafter: {s.steps} steps on the {'base' if base is not None else 'target'}'s continuations "
        f"of {len(generic)} generic chat prompts")

    fit_texts = _windows([t.text for t in fit], s.windows, s.prompt_len, s.seed)
    seqs = target_sequences(model, fit_texts, s.prompt_len, s.new_tokens, seed=s.seed)
    weights = disagreement_weights(model, starting, seqs, s.hard_weight)
    train_set = torch.cat([seqs, weighted_sample(seqs, weights, max(1, len(seqs) // 2), s.seed)])
    adapted, adapt_log = train_head(model, train_set, recipe(s, hard_weight=s.hard_weight, generic_mix=s.generic_mix),
                                    generic=generic, init=starting)
    log(f"adapted drafter: {s.steps} steps from the starting one on {len(seqs)} target sequences of the fit slice "
        f"(+{len(train_set) - len(seqs)} hard examples redrawn, mean disagreement weight {float(weights.mean()):.3f})")
    save_head(starting, out / "starting_head.pt")
    save_head(adapted, out / "adapted_head.pt")

    heads = {"starting": starting, "adapted": adapted}
    slices = {"held_out": _sample(held, s.measure_requests, s.seed),
              "serving": _sample(serving, s.measure_requests, s.seed + 1)}
    results: dict[str, dict] = {}
    for sl, texts in slices.items():
        refs: dict = {}
        for name, head in heads.items():
            results.setdefault(sl, {})[name] = measure(model, head, texts, k=s.k, prompt_len=s.prompt_len,
                                                       max_new=s.max_new, seed=s.seed, references=refs)
        st, ad = results[sl]["starting"]["mean_accept_length"], results[sl]["adapted"]["mean_accept_length"]
        results[sl]["adapted_over_starting"] = round(ad / st, 4) if st else None
        log(f"{sl}: mean acceptance length starting {st:.3f} -> adapted {ad:.3f} "
            f"({results[sl]['adapted_over_starting']}x) on {len(texts)} requests")
    gate = all(results[sl][n]["gate"]["passed"] for sl in results for n in heads)
    if original_logs:
        red = redaction_effect(original_logs, model, heads, s)
    else:
        red = {"skipped": "the pool keeps only redacted content; pass --original-logs (the logs the pool was "
                          "built from) to measure acceptance on original vs redacted text"}
    report = {
        "pool": str(pool.path), "pool_hash": pool.content_hash, "target": target_info, "settings": asdict(s),
        "training_set": {"fit_requests": len(fit), "held_out_requests": len(held), "fit_windows": len(fit_texts),
                         "sequences": len(seqs), "hard_examples_redrawn": len(train_set) - len(seqs),
                         "mean_disagreement_weight": round(float(weights.mean()), 4),
                         "generic_sequences": len(generic), "labels": "the target's own greedy continuations"},
        "starting_drafter": {"what": "the stock-drafter analogue: an EAGLE head trained on the "
                                     + ("base model's" if base is not None else "target's")
                                     + " continuations of a generic chat corpus (no pool text), served with the target",
                             "recipe": recipe(s).to_dict(),
                             **start_log},
        "adapted_drafter": {"what": "the starting head trained further on the target's continuations of the fit "
                                    "slice, hard examples redrawn and rejected positions weighted",
                            "recipe": recipe(s, hard_weight=s.hard_weight, generic_mix=s.generic_mix).to_dict(),
                            **adapt_log},
        "acceptance": results,
        "gate": {"rule": "greedy: every measured request's speculative output equals target-only decoding",
                 "passed": gate},
        "redaction_effect": red,
        "acceptance_file": "acceptance.json (adapted drafter on the serving split); acceptance_starting.json "
                           "(starting drafter); engine_options.spec_acceptance reads either",
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write_json(out / "acceptance_report.json", report, sort_keys=True)
    write_json(out / "acceptance.json", {**acceptance_distribution(results["serving"]["adapted"]),
                                         "drafter": "adapted", "slice": "serving"}, sort_keys=True)
    write_json(out / "acceptance_starting.json", {**acceptance_distribution(results["serving"]["starting"]),
                                                  "drafter": "starting", "slice": "serving"}, sort_keys=True)
    log(f"gate {'passed' if gate else 'FAILED'}; wrote {out / 'acceptance_report.json'} and {out / 'acceptance.json'} "
        f"in {report['wall_s']} s")
    return report
