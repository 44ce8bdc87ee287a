"""Owns the tiny byte-level target transformer used to train and measure drafters on CPU.

Vocabulary: the 256 byte values of UTF-8 text. The model returns both next-token logits and its
last hidden states (after the final norm), which an EAGLE-style head consumes. Weights come from
a seed and a brief training run on texts the caller gives, so its greedy outputs are predictable.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class LMConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 256
    vocab: int = VOCAB


class Block(nn.Module):
    """Pre-norm causal self-attention + GELU MLP."""

    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.h = n_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.n2(x))


class TinyLM(nn.Module):
    """Causal byte LM; ``forward(ids) -> (logits [B,T,V], hidden [B,T,D])``."""

    def __init__(self, cfg: LMConfig = LMConfig(), seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = ids.shape[1]
        if t > self.cfg.max_len:
            raise ValueError(f"sequence of {t} tokens exceeds the model's max_len {self.cfg.max_len}")
        x = self.emb(ids) + self.pos(torch.arange(t, device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        h = self.norm(x)
        return self.head(h), h

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> list[int]:
        """Plain autoregressive decoding (the reference speculative decoding must reproduce)."""
        ids = list(prompt)
        for _ in range(max_new):
            logits, _ = self(torch.tensor([ids[-self.cfg.max_len:]]))
            ids.append(sample_token(logits[0, -1], temperature, generator))
        return ids[len(prompt):]


def probs_of(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The decoding distribution at ``temperature``; greedy (0) is a one-hot on the argmax."""
    if temperature <= 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    return torch.softmax(logits.float() / temperature, -1)


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> int:
    if temperature <= 0:
        return int(logits.argmax(-1))
    return int(torch.multinomial(probs_of(logits, temperature), 1, generator=generator))


def batches(texts: list[str], seq_len: int, batch: int, rng: random.Random):
    """Random windows of ``seq_len + 1`` bytes from the texts (short texts are padded by repetition)."""
    data = [encode(t) for t in texts if t]
    if not data:
        raise ValueError("no training text")
    while True:
        rows = []
        for _ in range(batch):
            d = rng.choice(data)
            while len(d) < seq_len + 1:
                d = d + [10] + d
            s = rng.randrange(0, len(d) - seq_len)
            rows.append(d[s:s + seq_len + 1])
        yield torch.tensor(rows)


def train_lm(texts: list[str], cfg: LMConfig = LMConfig(), steps: int = 300, lr: float = 3e-3,
             seq_len: int = 64, batch: int = 32, seed: int = 0, init: TinyLM | None = None) -> tuple[TinyLM, float]:
    """Briefly train a TinyLM on ``texts`` (from scratch, or fine-tune a copy of ``init``: a
    post-trained model of a base); returns the model (eval mode) and its last loss."""
    model = TinyLM(init.cfg if init is not None else cfg, seed)
    if init is not None:
        model.load_state_dict(init.state_dict())
        for prm in model.parameters():
            prm.requires_grad_(True)
        cfg = model.cfg
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    it = batches(texts, min(seq_len, cfg.max_len - 1), batch, random.Random(seed))
    loss = torch.tensor(float("nan"))
    model.train()
    for _ in range(steps):
        x = next(it)
        logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    return model, float(loss.detach())


def save_lm(model: TinyLM, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(model.cfg), "state": model.state_dict()}, p)
    return p


def load_lm(path: str | Path) -> TinyLM:
    blob = torch.load(Path(path), map_location="cpu", weights_only=True)
    model = TinyLM(LMConfig(**blob["config"]))
    model.load_state_dict(blob["state"])
    model.eval()
    return model
