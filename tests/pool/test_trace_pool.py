import json

from autoresearch_dagster.pool.schema import read_pool
from autoresearch_dagster.pool.build import build_pool
from autoresearch_dagster.tokens import count_tokens

from .conftest import ROOT, write_lines


def _mooncake(tmp_path, rows):
    return write_lines(tmp_path / "mc.jsonl", [json.dumps(r) for r in rows])


def test_trace_prompts_have_exact_counts_and_prefix_structure(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1300, "output_length": 10, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": 2000, "output_length": 20, "hash_ids": [1, 2, 4, 5]},
            {"timestamp": 900, "input_length": 700, "output_length": 5, "hash_ids": [9, 10]},
            {"timestamp": 1200, "input_length": 600, "output_length": 5, "hash_ids": [1]},  # tail beyond listed blocks
            {"timestamp": 1500, "input_length": 300, "output_length": 5, "hash_ids": [1]}]  # partial first block
    res = build_pool([_mooncake(tmp_path, rows)], "t", tmp_path / "pool", workers=1)
    pool = read_pool(res.pool_path)
    texts = [pool.request(i).messages[0]["content"] for i in range(len(pool))]
    assert [count_tokens(t) for t in texts] == [r["input_length"] for r in rows]
    cut = lambda t, n: "".join(" " + w for w in t.split(" ")[1:n + 1])  # noqa: E731 — first n tokens
    assert cut(texts[0], 1024) == cut(texts[1], 1024)  # shared ids 1,2 => identical 1024 leading tokens
    assert cut(texts[0], 1536) != cut(texts[1], 1536)  # then 3 vs 4 differ
    assert cut(texts[0], 512) != cut(texts[2], 512)  # distinct first block => different text
    assert cut(texts[3], 512) == cut(texts[0], 512) and texts[0].startswith(texts[4])
    assert (tmp_path / "pool" / "blocks.parquet").exists() and pool.meta["block_tokens"] == 512
    assert res.fidelity["checks"]["synthesis.token_count_exact"]["value"] == 1.0
    assert pool.request(0).body()["messages"][0]["role"] == "user"


def test_csv_trace_pools(tmp_path):
    for name in ("azure_sample.csv", "burstgpt_sample.csv"):
        res = build_pool([ROOT / "examples/traces" / name], "t", tmp_path / name, workers=1)
        pool = read_pool(res.pool_path)
        assert len(pool) == 300 and res.fidelity["passed"]
        r = pool.request(5)
        assert count_tokens(r.messages[0]["content"]) == r.prompt_tokens
        assert pool.column("arrival_s")[0] == 0.0


def test_bulk_and_line_by_line_readers_build_the_same_pool(tmp_path):
    import random

    rng = random.Random(3)
    rows, t = [], 0
    for i in range(3000):
        t += rng.randint(0, 900)
        ts = t - rng.randint(0, 20000) if i % 50 == 7 else t  # some disorder: within and beyond the window
        n = rng.randint(1, 4000)
        rows.append(json.dumps({"timestamp": ts, "input_length": n, "output_length": rng.randint(1, 50),
                                "hash_ids": list(range(i, i + -(-n // 512)))}))
    rows[100] = '{"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": []}'
    rows[2500] = '{"timestamp": "soon"}'
    log = write_lines(tmp_path / "t.jsonl", rows)
    import autoresearch_dagster.pool.build as pb

    old = pb.TRACE_BATCH_LINES
    pb.TRACE_BATCH_LINES = 256  # many chunks: sorted ones take the columnar path, disordered ones do not
    try:
        a = build_pool([log], "t", tmp_path / "a", workers=1, bulk=True)
    finally:
        pb.TRACE_BATCH_LINES = old
    b = build_pool([log], "t", tmp_path / "b", workers=1, bulk=False)
    for k in ("rows_in", "rows_accepted", "rows_quarantined", "quarantine_reasons", "splits", "content_hash"):
        assert a.summary[k] == b.summary[k], k
    assert a.summary["rows_quarantined"] > 2  # the two bad rows and some late ones
    qa = (tmp_path / "a" / "quarantine.jsonl").read_text().splitlines()
    qb = (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()
    assert sorted(qa) == sorted(qb)
    pa_, pb_ = read_pool(a.pool_path), read_pool(b.pool_path)
    assert pa_.column("arrival_s") == pb_.column("arrival_s") and pa_.column("id") == pb_.column("id")
    import pytest

    for name in ("arrival.cv_ratio", "arrival.idc_10s_ratio", "prefix_hit_rate.delta_pp", "prompt_tokens.ks"):
        ca, cb = a.fidelity["checks"][name], b.fidelity["checks"][name]
        assert ca["value"] == pytest.approx(cb["value"], rel=1e-9) and ca.get("source") == pytest.approx(cb.get("source"))
