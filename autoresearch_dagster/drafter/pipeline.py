"""Owns the drafter's training set and acceptance measurement on a replay pool.

Training texts come only from the pool's ``training`` split (the serving split is what experiments
replay, so it is never trained on); content is used as stored, i.e. already redacted. Labels are
the target's own outputs: ``eagle.target_sequences`` regenerates continuations with the target, so a
log's response that the target would not produce never becomes a label. Coverage of the serving
split by the training split is reported per request type, prompt length bucket, language (script)
and conversation stage. Acceptance is measured by real speculative decoding and reported per
request type, with the greedy output checked token for token against target-only decoding (gate).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import torch

from autoresearch_dagster.drafter.model import TinyLM, encode
from autoresearch_dagster.drafter.speculative import AcceptanceStats, speculative_generate


@dataclass(frozen=True)
class TrafficText:
    id: str
    text: str
    kind: str  # request type: chat / multi_turn / tool / structured / completions
    length: str  # prompt length bucket
    language: str  # ascii / non_ascii script
    stage: str  # first / follow_up turn
    conversation: str | None = None


def _content(m: dict) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return "" if c is None else str(c)


def request_text(r) -> str:
    if r.api == "completions":
        return r.prompt or ""
    return "\n".join(_content(m) for m in (r.messages or []))


def _kind(r) -> str:
    if r.tools:
        return "tool"
    if r.response_format:
        return "structured"
    if r.api == "completions":
        return "completions"
    return "multi_turn" if (r.turn or 0) > 0 else "chat"


def _length(n: int) -> str:
    return "short" if n < 256 else "medium" if n < 2048 else "long"


def traffic_texts(pool, split: str) -> list[TrafficText]:
    """The pool's requests of ``split`` as texts with their request-type labels."""
    if split not in ("training", "serving"):
        raise ValueError(f"unknown split {split!r}")
    out = []
    for r in pool.iter_requests(split):
        t = request_text(r)
        if not t:
            continue
        out.append(TrafficText(r.id, t, _kind(r), _length(int(r.prompt_tokens or len(t) // 4)),
                               "ascii" if t.isascii() else "non_ascii",
                               "follow_up" if (r.turn or 0) > 0 else "first", r.conversation_id))
    return out


def coverage(training: list[TrafficText], serving: list[TrafficText]) -> dict:
    """Per dimension: counts in each split and the share of serving requests whose bucket the
    training split has at least one example of."""
    rep = {"training_requests": len(training), "serving_requests": len(serving)}
    for dim in ("kind", "length", "language", "stage"):
        tr = Counter(getattr(t, dim) for t in training)
        sv = Counter(getattr(t, dim) for t in serving)
        covered = sum(n for b, n in sv.items() if tr.get(b))
        rep[dim] = {"training": dict(tr), "serving": dict(sv),
                    "serving_covered": round(covered / len(serving), 4) if serving else None}
    return rep


@torch.no_grad()
def disagreement_weights(target: TinyLM, head, seqs: torch.Tensor, hard_weight: float = 1.0) -> torch.Tensor:
    """Per-sequence weight 1 + hard_weight * (share of positions where the head's argmax differs from
    the target's): hard examples for the drafter are drawn more often."""
    lo, h = target(seqs)
    logits, _ = head(h[:, :-1], seqs[:, 1:])
    dis = (logits.argmax(-1) != lo[:, 1:].argmax(-1)).float().mean(-1)
    return 1.0 + hard_weight * dis


def weighted_sample(seqs: torch.Tensor, weights: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return seqs[torch.multinomial(weights / weights.sum(), n, replacement=True, generator=g)]


def prompt_of(text: str, prompt_len: int) -> list[int]:
    """The last ``prompt_len`` bytes of the text (where the model would continue), as
    ``eagle.target_sequences`` builds its training windows; short texts are padded by repetition."""
    e = encode(text) or [10]
    while len(e) < prompt_len:
        e = e + [10] + e
    return e[-prompt_len:]


@torch.no_grad()
def measure(target: TinyLM, head, texts: list[TrafficText], *, k: int, prompt_len: int, max_new: int,
            temperature: float = 0.0, seed: int = 0, references: dict | None = None) -> dict:
    """Real speculative decoding on each text's prompt: acceptance overall and per request type, and
    the gate (greedy: output identical to target-only decoding, checked on every request).
    ``references`` caches target-only outputs by prompt across drafters measured on the same texts."""
    overall, by_kind = AcceptanceStats(k), {}
    mismatches = 0
    g = torch.Generator().manual_seed(seed)
    for t in texts:
        p = prompt_of(t.text, prompt_len)
        out, st = speculative_generate(target, head, p, max_new, k, temperature, g, target.cfg.max_len)
        if temperature <= 0:
            key = (tuple(p), max_new)
            ref = references.get(key) if references is not None else None
            if ref is None:
                ref = target.generate(p, max_new)
                if references is not None:
                    references[key] = ref
            mismatches += out != ref
        overall.add(st)
        by_kind.setdefault(t.kind, AcceptanceStats(k)).add(st)
    return {**overall.to_dict(), "requests": len(texts),
            "by_request_type": {kk: v.to_dict() for kk, v in sorted(by_kind.items())},
            "gate": {"checked": temperature <= 0, "mismatched_requests": mismatches,
                     "passed": mismatches == 0}}


def acceptance_distribution(stats: dict) -> dict:
    """The measured acceptance file the emulator reads: k, per-position conditional acceptance and the
    histogram of accepted drafts per verify step."""
    return {"k": stats["k"], "mean_accept_length": stats["mean_accept_length"],
            "per_position": stats["per_position"], "histogram": stats["histogram"], "source": "measured"}


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
