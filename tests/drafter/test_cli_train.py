from __future__ import annotations

import json
import random

import pytest

from autoresearch_dagster.cli import main
from autoresearch_dagster.emulator.spec_acceptance import SpecAcceptance
from autoresearch_dagster.pool.schema import PoolRequest, write_pool

_WORDS = ["order", "refund", "shipping", "invoice", "account", "billing", "delayed", "status", "ticket", "policy"]


def _pool(tmp):
    """A support-traffic pool: the target's fine-tuning text is endpoint-specific, unlike generic chat."""
    rng = random.Random(3)
    rows = []
    for i in range(60):
        words = " ".join(rng.choice(_WORDS) for _ in range(40))
        text = f"Customer {i} writes about the {words}. Please check the order status and refund policy."
        rows.append(PoolRequest(id=f"r{i}", arrival_s=float(i), conversation_id=f"c{i}", turn=0, api="chat",
                                messages=[{"role": "user", "content": text}], prompt=None,
                                tools=[{"type": "function", "function": {"name": "lookup"}}] if i % 5 == 0 else None,
                                tool_choice=None, response_format=None, sampling={}, prompt_tokens=len(text) // 4,
                                output_tokens=20, block_hashes=[], block_tokens=64,
                                split="training" if i % 2 == 0 else "serving"))
    return write_pool(rows, tmp / "pool", {"token_counter": "test"})


def test_drafter_train_writes_the_report_and_the_adapted_drafter_accepts_more(tmp_path, capsys):
    pool = _pool(tmp_path)
    out = tmp_path / "out"
    rc = main(["drafter", "train", "--pool", str(pool), "--target", "tiny", "--out", str(out), "--steps", "150",
               "--target-steps", "200", "--measure-requests", "8", "--max-new", "16"])
    assert rc == 0
    for f in ("coverage.json", "acceptance_report.json", "acceptance.json", "acceptance_starting.json",
              "target.pt", "starting_head.pt", "adapted_head.pt"):
        assert (out / f).is_file(), f
    rep = json.loads((out / "acceptance_report.json").read_text())
    cov = json.loads((out / "coverage.json").read_text())
    assert cov["training_requests"] == 30 and cov["serving_requests"] == 30
    assert rep["target"]["kind"] == "cpu_stand_in"
    assert rep["gate"]["passed"]
    held = rep["acceptance"]["held_out"]
    assert held["adapted"]["mean_accept_length"] > held["starting"]["mean_accept_length"]
    assert held["adapted"]["requests"] == min(8, rep["training_set"]["held_out_requests"]) > 0
    assert rep["acceptance"]["serving"]["adapted"]["requests"] == 8 and set(rep["acceptance"]["serving"]["adapted"]["by_request_type"]) <= {"chat", "tool"}
    assert "skipped" in rep["redaction_effect"]  # the pool holds redacted content only
    acc = SpecAcceptance.load(out / "acceptance.json")
    assert len(acc.per_position) == 4
    assert acc.mean_accept_length(4) == pytest.approx(
        rep["acceptance"]["serving"]["adapted"]["mean_accept_length"], abs=0.02)
    assert "held_out: mean acceptance length" in capsys.readouterr().out


def test_drafter_train_rejects_a_pool_without_training_text(tmp_path, capsys):
    rows = [PoolRequest(id="r0", arrival_s=0.0, conversation_id="c0", turn=0, api="chat",
                        messages=[{"role": "user", "content": "hello"}], prompt=None, tools=None, tool_choice=None,
                        response_format=None, sampling={}, prompt_tokens=2, output_tokens=2, block_hashes=[],
                        block_tokens=64, split="serving")]
    pool = write_pool(rows, tmp_path / "pool", {"token_counter": "test"})
    assert main(["drafter", "train", "--pool", str(pool), "--out", str(tmp_path / "o")]) == 2
    assert "training split" in capsys.readouterr().err
