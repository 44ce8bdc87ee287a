"""The drafter's models are tiny: one torch thread is as fast on an idle machine and far faster on shared
cores, where torch's OpenMP threads wait on each other (30 target training steps took 51 s with 2 threads,
3.6 s with 1, on 2 cores at load average 10)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
