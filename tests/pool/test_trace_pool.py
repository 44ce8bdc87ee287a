import json

from autoresearch_dagster.pool import read_pool
from autoresearch_dagster.pool_build import build_pool
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
