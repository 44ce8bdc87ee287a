"""Owns exact speculative decoding: draft k tokens, verify them with the target in one forward
pass, accept by the rule that keeps the output distribution identical to the target's.

Greedy (temperature 0): a draft token is accepted while it equals the target's argmax; the first
mismatch is replaced by the target's argmax, and when all k are accepted the target's next argmax
is appended (the bonus token). The output equals target-only greedy decoding token for token.

Sampling (temperature > 0), Leviathan et al. / Chen et al.: draft token d with drafter probability
q(d) and target probability p(d) is accepted with probability min(1, p(d)/q(d)); on the first
rejection a token is drawn from the residual max(0, p - q) / sum(max(0, p - q)); when all k are
accepted a bonus token is drawn from the target's next distribution. Each emitted token is then
distributed exactly as the target's at that temperature.

A target is any callable ``target(ids [1, T]) -> (logits [1, T, V], hidden [1, T, D])``. A drafter
has ``draft(ids, hidden, k, temperature, generator) -> (tokens, q [k, V])`` where ``hidden`` holds the
target's last hidden states for ``ids[:-1]`` (the last token has not been through the target yet).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from autoresearch_dagster.drafter.model import probs_of


class Drafter(Protocol):
    def draft(self, ids: list[int], hidden: torch.Tensor, k: int, temperature: float,
              generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]: ...


@dataclass
class AcceptanceStats:
    """Per verify step: how many of the k drafted tokens the target accepted."""

    k: int
    accepted: list[int] = field(default_factory=list)

    def add(self, other: "AcceptanceStats") -> None:
        if other.k != self.k:
            raise ValueError(f"cannot merge acceptance at k={other.k} into k={self.k}")
        self.accepted.extend(other.accepted)

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Tokens emitted per target forward (accepted drafts + the corrected or bonus token),
        SGLang's ``accept_length``."""
        return self.mean_accepted + 1.0 if self.accepted else 0.0

    def per_position(self) -> list[float]:
        """P(draft position i accepted | positions before it accepted), i = 1..k."""
        out = []
        for i in range(1, self.k + 1):
            reached = sum(1 for a in self.accepted if a >= i - 1)
            out.append(sum(1 for a in self.accepted if a >= i) / reached if reached else 0.0)
        return out

    def histogram(self) -> list[int]:
        """Number of verify steps that accepted exactly 0..k drafts."""
        h = [0] * (self.k + 1)
        for a in self.accepted:
            h[a] += 1
        return h

    def implied_speedup(self, draft_cost: float) -> float:
        """Tokens per unit time vs plain decoding, when one draft step costs ``draft_cost`` target
        forwards and a verify pass costs one (memory-bound decoding)."""
        return self.mean_accept_length / (1.0 + self.k * draft_cost) if self.accepted else 1.0

    def to_dict(self, draft_cost: float | None = None) -> dict:
        d = {"k": self.k, "verify_steps": self.steps, "mean_accepted": round(self.mean_accepted, 4),
             "mean_accept_length": round(self.mean_accept_length, 4),
             "per_position": [round(x, 4) for x in self.per_position()], "histogram": self.histogram()}
        if draft_cost is not None:
            d["draft_cost"] = draft_cost
            d["implied_speedup"] = round(self.implied_speedup(draft_cost), 4)
        return d


def verify(drafts: list[int], q: torch.Tensor, p: torch.Tensor, temperature: float,
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """The acceptance rule. ``q`` [k, V]: drafter distributions the drafts came from; ``p`` [k+1, V]:
    target distributions at the k draft positions and the one after. Returns (accepted count n,
    the token emitted after the n accepted drafts)."""
    k = len(drafts)
    if temperature <= 0:
        target = p.argmax(-1).tolist()
        for i, d in enumerate(drafts):
            if d != target[i]:
                return i, target[i]
        return k, target[k]
    for i, d in enumerate(drafts):
        r = float(torch.rand((), generator=generator))
        if r * float(q[i, d]) < float(p[i, d]):  # accept with probability min(1, p/q)
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q numerically: rejection has probability 0
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


@torch.no_grad()
def speculative_generate(target, drafter: Drafter, prompt: list[int], max_new: int, k: int,
                         temperature: float = 0.0, generator: torch.Generator | None = None,
                         max_len: int | None = None) -> tuple[list[int], AcceptanceStats]:
    """Decode ``max_new`` tokens after ``prompt`` with speculative decoding; returns the tokens and the
    acceptance of each verify step. The first token comes from the target's prefill."""
    if k < 1:
        raise ValueError("k must be at least 1")
    if not prompt:
        raise ValueError("empty prompt")
    if max_len is not None and len(prompt) + max_new + k + 1 > max_len:
        raise ValueError(f"prompt {len(prompt)} + max_new {max_new} + k {k} exceeds the target's max_len {max_len}")
    stats = AcceptanceStats(k)
    logits, hidden = target(torch.tensor([prompt]))
    ids = list(prompt)
    ids.append(int(torch.multinomial(probs_of(logits[0, -1], temperature), 1, generator=generator))
               if temperature > 0 else int(logits[0, -1].argmax()))
    feats = hidden[0]  # target hidden states for ids[:-1]
    while len(ids) - len(prompt) < max_new:
        drafts, q = drafter.draft(ids, feats, k, temperature, generator)
        t = len(ids)
        logits, hidden = target(torch.tensor([ids + drafts]))
        p = probs_of(logits[0, t - 1:t + k], temperature)
        n, nxt = verify(drafts, q, p, temperature, generator)
        stats.accepted.append(n)
        ids.extend(drafts[:n])
        feats = hidden[0, :len(ids)]
        ids.append(nxt)
    return ids[len(prompt):len(prompt) + max_new], stats
