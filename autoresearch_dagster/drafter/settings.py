"""Owns the drafter trainer's settings (no torch import: the CLI reads its defaults at startup)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DrafterSettings:
    steps: int = 300  # head training steps (starting and adapted each)
    depth: int = 1
    lr: float = 3e-3
    k: int = 4  # draft tokens per verify step
    hard_weight: float = 1.0  # disagreement weighting: hard sequences redrawn and rejected positions weighted
    generic_mix: float = 0.1  # share of each adapted batch still drawn from the generic corpus
    prompt_len: int = 48
    new_tokens: int = 40  # target continuation length of each training sequence
    windows: int = 4  # training windows per fit text (different cut points)
    max_new: int = 32  # tokens decoded per measured request
    measure_requests: int = 40  # per measured slice
    heldout_percent: int = 25  # conversations of the training split held out for measurement
    target_steps: int = 400  # CPU stand-in target: fine-tuning steps (its base trains half as many)
    seed: int = 0
