"""Owns the emulator's measured speculative-decoding acceptance.

Without one the emulator draws each draft position's acceptance from a fixed per-algorithm rate
(``resolve.ACCEPT_PROB``). A measured distribution replaces it: the per-position conditional
acceptance P(position i accepted | positions before accepted) from a drafter acceptance file
(``autoresearch drafter train`` writes ``acceptance.json``), or a constant rate solved
from a real SGLang's reported mean accept length (``/server_info`` ``avg_spec_accept_length``,
``sglang:spec_accept_length``). Positions beyond the measured k reuse the last measured rate.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SpecAcceptance:
    per_position: tuple[float, ...] = ()
    source: str = "measured"
    accept_length: float | None = None  # a reported mean accept length, solved per draft depth

    def __post_init__(self):
        if self.accept_length is None and not self.per_position:
            raise ValueError("a measured acceptance needs per_position rates or an accept_length")
        if any(not 0.0 <= p <= 1.0 for p in self.per_position):
            raise ValueError("per_position acceptance must be probabilities in [0, 1]")
        if self.accept_length is not None and self.accept_length < 1.0:
            raise ValueError(f"accept length {self.accept_length} is below 1")

    def rates(self, steps: int) -> list[float]:
        if self.accept_length is not None:  # capped at what ``steps`` can reach
            al = min(self.accept_length, steps + 1.0)
            return SpecAcceptance.from_accept_length(al, steps).rates(steps) if steps else []
        p = list(self.per_position)
        return (p + [p[-1]] * steps)[:steps]

    def mean_accept_length(self, steps: int) -> float:
        """Tokens per verify step (accepted drafts + 1) implied at ``steps`` draft steps."""
        total, run = 1.0, 1.0
        for p in self.rates(steps):
            run *= p
            total += run
        return total

    @classmethod
    def load(cls, path: str | Path) -> "SpecAcceptance":
        d = json.loads(Path(path).read_text())
        return cls(tuple(float(x) for x in d["per_position"]), str(d.get("source", path)))

    @classmethod
    def from_accept_length(cls, accept_length: float, steps: int) -> "SpecAcceptance":
        """The constant per-position rate whose truncated-geometric mean accept length at ``steps``
        equals the reported one (bisection; 1.0 means no draft accepted)."""
        if steps < 1 or not 1.0 <= accept_length <= steps + 1:
            raise ValueError(f"accept length {accept_length} outside [1, {steps + 1}] at {steps} steps")
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if cls((mid,)).mean_accept_length(steps) < accept_length:
                lo = mid
            else:
                hi = mid
        return cls(((lo + hi) / 2,), "reported_accept_length")


DRAFTER_FILE = "acceptance.json"


def drafter_acceptance(config: dict | None) -> SpecAcceptance | None:
    """The measured acceptance of the drafter a config names (``speculative_draft_model_path``: the
    directory ``autoresearch drafter train`` writes, with ``acceptance.json`` beside the weights); None
    when the config names none, or names a drafter with no measured distribution (the algorithm's
    rate then applies, as for a stock drafter)."""
    path = (config or {}).get("speculative_draft_model_path")
    if not path:
        return None
    f = Path(path) / DRAFTER_FILE
    return SpecAcceptance.load(f) if f.is_file() else None


def acceptance_option(options: dict | None) -> SpecAcceptance | None:
    """``engine_options: {spec_acceptance: PATH}`` (an acceptance distribution file) or
    ``{spec_acceptance: 2.8}`` (a real server's reported mean accept length); None when unset."""
    v = (options or {}).get("spec_acceptance")
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return SpecAcceptance(accept_length=float(v), source="reported_accept_length")
    return SpecAcceptance.load(v)
