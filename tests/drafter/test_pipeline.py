from __future__ import annotations

import torch

from autoresearch_dagster.drafter.eagle import HeadRecipe, target_sequences, train_head
from autoresearch_dagster.drafter.model import LMConfig, train_lm
from autoresearch_dagster.drafter.pipeline import (acceptance_distribution, coverage, disagreement_weights,
                                                   measure, traffic_texts, weighted_sample)
from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool


def _pool(tmp):
    rows = []
    for i in range(24):
        split = "training" if i % 3 == 0 else "serving"
        tools = [{"type": "function", "function": {"name": "f"}}] if i % 4 == 0 else None
        rows.append(PoolRequest(id=f"r{i}", arrival_s=float(i), conversation_id=f"c{i}", turn=i % 2, api="chat",
                                messages=[{"role": "user", "content": f"order {i} status shipped order {i} ok"}],
                                prompt=None, tools=tools, tool_choice=None, response_format=None, sampling={},
                                prompt_tokens=40, output_tokens=20, block_hashes=[], block_tokens=64, split=split))
    return read_pool(write_pool(rows, tmp / "pool", {"token_counter": "test"}))


def test_training_set_comes_only_from_training_split_and_coverage_is_reported(tmp_path):
    pool = _pool(tmp_path)
    train, serve = traffic_texts(pool, "training"), traffic_texts(pool, "serving")
    assert {t.id for t in train} == {f"r{i}" for i in range(0, 24, 3)}
    assert not {t.id for t in train} & {t.id for t in serve}
    cov = coverage(train, serve)
    assert cov["training_requests"] == 8 and cov["serving_requests"] == 16
    assert set(cov["kind"]["serving"]) <= {"tool", "chat", "multi_turn"}
    assert 0.0 < cov["kind"]["serving_covered"] <= 1.0
    # a serving bucket the training split lacks lowers its coverage
    assert coverage(train[:1], serve)["stage"]["serving_covered"] < 1.0


def test_acceptance_is_measured_with_the_gate_and_hard_examples_weigh_more(tmp_path):
    pool = _pool(tmp_path)
    train = traffic_texts(pool, "training")
    cfg = LMConfig(d_model=32, n_layers=1, n_heads=2, max_len=64)
    target, _ = train_lm([t.text for t in train], cfg, steps=40, seq_len=32, batch=8)
    seqs = target_sequences(target, [t.text for t in train], 12, 16)
    head, log = train_head(target, seqs, HeadRecipe(steps=20, batch=4))
    assert log["final_loss"] < log["first_loss"]
    w = disagreement_weights(target, head, seqs, hard_weight=2.0)
    assert w.shape == (len(seqs),) and bool((w >= 1.0).all()) and bool((w <= 3.0).all())
    heavy = torch.zeros(len(seqs))
    heavy[0] = 1.0
    assert bool((weighted_sample(seqs, heavy, 5) == seqs[0]).all())
    rep = measure(target, head, train[:4], k=3, prompt_len=12, max_new=10)
    assert rep["gate"]["passed"] and rep["requests"] == 4
    assert 1.0 <= rep["mean_accept_length"] <= 4.0
    assert sum(v["verify_steps"] for v in rep["by_request_type"].values()) == rep["verify_steps"]
    dist = acceptance_distribution(rep)
    assert dist["k"] == 3 and sum(dist["histogram"]) == rep["verify_steps"]
