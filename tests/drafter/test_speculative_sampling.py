"""The sampling acceptance rule keeps the target's distribution: over many draws, the token emitted at a
verify step (accepted draft or residual draw) is distributed as the target's, whatever the drafter's."""
from __future__ import annotations

import torch

from autoresearch_dagster.drafter.speculative import verify


def _emitted(p: torch.Tensor, q: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    pk = torch.stack([p, p])  # k = 1: the draft position and the bonus position
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g))
        acc, nxt = verify([d], q.unsqueeze(0), pk, 1.0, g)
        counts[d if acc == 1 else nxt] += 1
    return counts / n


def test_rejection_sampling_emits_the_target_distribution_and_greedy_the_argmax():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    far = torch.tensor([0.05, 0.05, 0.1, 0.8])  # a drafter that disagrees with the target
    for q in (far, p):
        freq = _emitted(p, q, 6000)
        assert float((freq - p).abs().max()) < 0.03, (q, freq)
    # the drafter's own distribution is not what comes out when it differs from the target's
    assert float((_emitted(p, far, 6000) - far).abs().max()) > 0.3
    # greedy: the first mismatch is replaced by the target's argmax; all accepted adds the bonus argmax
    onehot = torch.eye(4)
    assert verify([0, 2], onehot[[0, 0]], onehot[[0, 1, 3]], 0.0) == (1, 1)
    assert verify([0, 1], onehot[[0, 1]], onehot[[0, 1, 3]], 0.0) == (2, 3)
