import json
import pytest

from autoresearch_dagster.pool.schema import PoolRequest, read_pool, write_pool
from autoresearch_dagster.pool.build import build_pool

from .conftest import ROOT, chat_line, write_lines


def _req(i, **kw):
    base = dict(id=f"r{i}", arrival_s=i * 0.5, conversation_id="c1", turn=1, api="chat",
                messages=[{"role": "user", "content": f"hello {i}"}], prompt=None, tools=None, tool_choice=None,
                response_format={"type": "json_object"}, sampling={"temperature": 0.5, "max_tokens": 9, "stream": True},
                prompt_tokens=4, output_tokens=9, block_hashes=[1, 2], block_tokens=64, split="serving")
    base.update(kw)
    return PoolRequest(**base)


def test_write_read_roundtrip_and_body(tmp_path):
    rows = [_req(i) for i in range(5)] + [_req(5, split="training")]
    path = write_pool(rows, tmp_path / "p", {"endpoint": "x"})
    pool = read_pool(tmp_path / "p")
    assert len(pool) == 6 and pool.meta["endpoint"] == "x" and len(pool.content_hash) == 64
    assert pool.request(2) == rows[2]
    assert len(list(pool.iter_requests())) == 5 and len(list(pool.iter_requests(None))) == 6
    body = pool.request(0).body()
    assert body == {"messages": rows[0].messages, "response_format": {"type": "json_object"}, "temperature": 0.5}
    assert read_pool(path).content_hash == pool.content_hash


def test_failed_build_leaves_no_pool_and_keeps_previous(tmp_path):
    log = write_lines(tmp_path / "l.jsonl", [chat_line(1000.0 + i) for i in range(50)])
    with pytest.raises(RuntimeError, match="injected"):
        build_pool([log], "t", tmp_path / "pool", workers=1, _fail_after=20)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.jsonl"]
    good = build_pool([log], "t", tmp_path / "pool", workers=1)
    h = read_pool(good.pool_path).content_hash
    with pytest.raises(RuntimeError):
        build_pool([log], "t", tmp_path / "pool", workers=1, _fail_after=10)
    assert read_pool(tmp_path / "pool").content_hash == h
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.jsonl", "pool"]


def test_parallel_workers_match_serial(tmp_path):
    log = ROOT / "examples/logs/demo_chat.jsonl"
    a = build_pool([log], "t", tmp_path / "a", key=b"k", workers=1, max_records=150)
    b = build_pool([log], "t", tmp_path / "b", key=b"k", workers=2, max_records=150)
    assert a.summary["redactions"] == b.summary["redactions"]
    assert read_pool(a.pool_path).content_hash == read_pool(b.pool_path).content_hash


def test_cli_build_and_fidelity(tmp_path, capsys):
    from autoresearch_dagster.cli import main

    out = tmp_path / "pool"
    args = ["pool", "build", "--logs", str(ROOT / "examples/logs/bad_records.jsonl"), "--endpoint", "demo",
            "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "quarantined" in printed and "fidelity: PASSED" in printed
    for name in ("replay_pool.parquet", "fidelity.json", "quarantine.jsonl", "summary.json"):
        assert (out / name).exists()
    s = json.loads((out / "summary.json").read_text())
    assert s["rows_in"] == s["rows_accepted"] + s["rows_quarantined"] and s["rows_quarantined"] > 0
    assert main(["pool", "fidelity", "--pool", str(out)]) == 0
    assert "prompt_tokens.ks" in capsys.readouterr().out
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["pool", "build", "--logs", str(tmp_path / "empty.jsonl"), "--endpoint", "d", "--out",
                 str(tmp_path / "p2")]) == 2
    err = capsys.readouterr().err
    assert "empty" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "p2").exists()


def test_exact_tokenizer_counts_and_is_recorded(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from autoresearch_dagster.tokens import render_prompt

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [json.loads(l)["request"]["messages"][0]["content"] for l in
              (ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines()[:50]]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    log = write_lines(tmp_path / "l.jsonl", [chat_line(1000.0 + i, content=f"Question {i}: mail ann{i}@example.com")
                                             for i in range(20)])
    res = build_pool([log], "t", tmp_path / "pool", workers=1, tokenizer_path=str(tmp_path / "tokenizer.json"))
    pool = read_pool(res.pool_path)
    assert pool.meta["token_counter"] == f"hf:{tmp_path / 'tokenizer.json'}"
    for i in range(len(pool)):
        r = pool.request(i)
        assert r.prompt_tokens == len(tok.encode(render_prompt(r.messages, r.tools), add_special_tokens=False).ids)
    assert res.summary["redactions"]["email"] == 20
    assert abs(res.summary["prompt_token_change"]) < 0.05


def test_several_files_and_mixed_kinds(tmp_path):
    from autoresearch_dagster.spec import SpecError

    a = write_lines(tmp_path / "a.jsonl", [chat_line(1000.0 + i) for i in range(5)])
    b = write_lines(tmp_path / "b.jsonl", [chat_line(1010.0 + i) for i in range(5)])
    res = build_pool([a, b], "t", tmp_path / "pool", workers=1)
    assert res.summary["rows_accepted"] == 10 and read_pool(res.pool_path).column("arrival_s")[-1] == 14.0
    with pytest.raises(SpecError, match="cannot mix"):
        build_pool([a, ROOT / "examples/traces/azure_sample.csv"], "t", tmp_path / "p2", workers=1)
