"""Owns the EAGLE-style draft head and its trainer.

The head fuses the target's last hidden state at position t with the embedding of token t+1
(``fc: [f_t; e(x_{t+1})] -> d``), runs ``depth`` causal transformer blocks, and outputs a feature
g_{t+1} that stands in for the target's hidden state at t+1; the target's own (frozen) LM head
turns it into next-token logits. Drafting is autoregressive on the head's own features.

Training (self-distillation): sequences are a prompt plus the target's own continuation; the
labels are the target's next-token distributions (soft cross-entropy) plus a smooth-L1 regression
of g_{t+1} onto f_{t+1}. Recipe choices: ``depth``, ``lr``, ``steps``, the data mix (a fraction of
generic texts mixed into the traffic texts) and hard-example weighting (positions where the
head's argmax disagrees with the target's weigh more).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoresearch_dagster.drafter.model import Block, TinyLM, encode, probs_of


class EagleHead(nn.Module):
    def __init__(self, target: TinyLM, depth: int = 1, seed: int = 0):
        super().__init__()
        if depth < 1:
            raise ValueError("depth must be at least 1")
        torch.manual_seed(seed)
        d = target.cfg.d_model
        self.depth = depth
        self.fc = nn.Linear(2 * d, d)
        self.blocks = nn.ModuleList(Block(d, target.cfg.n_heads) for _ in range(depth))
        self._target = (target,)  # not a submodule: the target's weights stay frozen and out of state_dict

    @property
    def target(self) -> TinyLM:
        return self._target[0]

    def forward(self, feats: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``feats`` [B,T,D] target hidden at t, ``tokens`` [B,T] token t+1 -> (logits for t+2, g_{t+1})."""
        x = self.fc(torch.cat([feats, self.target.emb(tokens)], -1))
        for blk in self.blocks:
            x = blk(x)
        return self.target.head(x), x

    @torch.no_grad()
    def draft(self, ids: list[int], hidden: torch.Tensor, k: int, temperature: float,
              generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor]:
        feats = hidden[: len(ids) - 1].unsqueeze(0)
        toks = torch.tensor([ids[1:]])
        out, qs = [], []
        for _ in range(k):
            logits, g = self(feats, toks)
            q = probs_of(logits[0, -1], temperature)
            d = int(torch.multinomial(q, 1, generator=generator)) if temperature > 0 else int(q.argmax())
            out.append(d)
            qs.append(q)
            feats = torch.cat([feats, g[:, -1:]], 1)
            toks = torch.cat([toks, torch.tensor([[d]])], 1)
        return out, torch.stack(qs)


@dataclass(frozen=True)
class HeadRecipe:
    depth: int = 1
    lr: float = 3e-3
    steps: int = 200
    batch: int = 16
    generic_mix: float = 0.0  # fraction of each batch drawn from the generic set (adapted drafters)
    hard_weight: float = 0.0  # extra loss weight on positions where head and target argmax disagree
    feature_weight: float = 0.5
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def target_sequences(target: TinyLM, texts: list[str], prompt_len: int, new_tokens: int,
                     temperature: float = 0.0, seed: int = 0, batch: int = 64) -> torch.Tensor:
    """Prompt windows (the last ``prompt_len`` bytes of each text, left-padded by repetition) followed
    by the target's own continuation: the drafter's training inputs are the target's outputs."""
    prompts = []
    for t in texts:
        e = encode(t) or [10]
        while len(e) < prompt_len:
            e = [10] + e if len(e) >= prompt_len - 1 else e + [10] + e
        prompts.append(e[-prompt_len:])
    if prompt_len + new_tokens > target.cfg.max_len:
        raise ValueError("prompt_len + new_tokens exceeds the target's max_len")
    g = torch.Generator().manual_seed(seed)
    rows = []
    for s in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[s:s + batch])
        for _ in range(new_tokens):
            logits, _ = target(ids)
            p = probs_of(logits[:, -1], temperature)
            nxt = torch.multinomial(p, 1, generator=g) if temperature > 0 else p.argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
        rows.append(ids)
    return torch.cat(rows) if rows else torch.zeros((0, prompt_len + new_tokens), dtype=torch.long)


@torch.no_grad()
def _labels(target: TinyLM, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    feats, logps = [], []
    for s in range(0, len(seqs), 64):
        lo, h = target(seqs[s:s + 64])
        feats.append(h)
        logps.append(torch.log_softmax(lo.float(), -1))
    return torch.cat(feats), torch.cat(logps)


def train_head(target: TinyLM, seqs: torch.Tensor, recipe: HeadRecipe = HeadRecipe(),
               generic: torch.Tensor | None = None, init: EagleHead | None = None) -> tuple[EagleHead, dict]:
    """Train (or continue training ``init``) an EAGLE head on target sequences ``seqs`` [N, L]."""
    for prm in target.parameters():
        prm.requires_grad_(False)
    head = EagleHead(target, recipe.depth, recipe.seed)
    if init is not None:
        if init.depth != recipe.depth:
            raise ValueError(f"cannot continue a depth-{init.depth} head at depth {recipe.depth}")
        head.load_state_dict(init.state_dict())
    if len(seqs) == 0:
        raise ValueError("no training sequences")
    feats, logps = _labels(target, seqs)
    g_feats = g_logps = None
    if generic is not None and recipe.generic_mix > 0 and len(generic):
        g_feats, g_logps = _labels(target, generic)
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, weight_decay=0.0)
    rng = random.Random(recipe.seed)
    n_generic = int(round(recipe.batch * recipe.generic_mix)) if g_feats is not None else 0
    losses = []
    head.train()
    for _ in range(recipe.steps):
        idx = [rng.randrange(len(seqs)) for _ in range(recipe.batch - n_generic)]
        sx, fx, lx = seqs[idx], feats[idx], logps[idx]
        if n_generic:
            gi = [rng.randrange(len(generic)) for _ in range(n_generic)]
            sx, fx, lx = torch.cat([sx, generic[gi]]), torch.cat([fx, g_feats[gi]]), torch.cat([lx, g_logps[gi]])
        logits, g = head(fx[:, :-1], sx[:, 1:])
        tgt_logp = lx[:, 1:]  # target's distribution for token t+2 lives at position t+1
        ce = -(tgt_logp.exp() * torch.log_softmax(logits, -1)).sum(-1)
        if recipe.hard_weight > 0:
            ce = ce * (1.0 + recipe.hard_weight * (logits.argmax(-1) != tgt_logp.argmax(-1)).float())
        loss = ce.mean() + recipe.feature_weight * F.smooth_l1_loss(g, fx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    head.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return head, {"steps": recipe.steps, "first_loss": round(losses[0], 4) if losses else None,
                  "final_loss": round(sum(tail) / len(tail), 4) if tail else None}


def save_head(head: EagleHead, path) -> None:
    torch.save({"depth": head.depth, "state": head.state_dict()}, path)


def load_head(target: TinyLM, path) -> EagleHead:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    head = EagleHead(target, int(blob["depth"]))
    head.load_state_dict(blob["state"])
    head.eval()
    return head
