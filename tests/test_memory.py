"""The findings memory: plain files, no repeats under the same conditions, disagreements kept, its own git repository."""
import subprocess

import pytest

from autoresearch_dagster.memory import Conditions, Memory, MemoryVersionError, finding_rows, technique

COND = Conditions(engine="emulator", engine_version="emulator-0.1", model="gemma-moe-26b-a4b", gpu="H200", gpus=1,
                  pool_hash="p1", traits={"mean_prompt_tokens": 3000.0, "mean_output_tokens": 300.0,
                                          "prefix_hit_rate": 0.6})


def _entry(h, verdict, cond=COND):
    return {"campaign_id": "c1", "experiment_id": f"e-{h}", "baseline_hash": "b0", "candidate_hash": h,
            "verdict": verdict, "conditions_key": cond.key()}


def _finding(endpoint, outcome, ratio, family="gemma", gpu="H200"):
    return {"endpoint": endpoint, "technique": technique({"speculative_algorithm": "EAGLE"}), "outcome": outcome,
            "ratio": ratio, "model_family": family, "gpu": gpu, "bottleneck": "decode_bound_small_batch",
            "traits": COND.traits, "experiment_id": f"e-{endpoint}"}


def test_a_tried_config_is_not_rerun_unless_conditions_changed(tmp_path):
    mem = Memory(tmp_path / "memory")
    mem.record("demo", _entry("h1", "same"), None)
    mem.record("demo", _entry("h2", "better"), None)
    assert set(mem.tested("demo", "b0", COND)) == {"h1"}  # a remembered better deserves a fresh confirmation
    newer = Conditions(**{**COND.__dict__, "engine_version": "emulator-0.2"})
    assert mem.tested("demo", "b0", newer) == {}
    assert mem.tested("demo", "other-baseline", COND) == {}
    assert (tmp_path / "memory" / "endpoints" / "demo.jsonl").read_text().count("\n") == 2
    assert (tmp_path / "memory" / "README.md").exists()


def test_disagreements_across_endpoints_are_kept_side_by_side(tmp_path):
    mem = Memory(tmp_path)
    mem.record("a", _entry("x", "better"), _finding("a", "helped", 1.2))
    mem.record("b", _entry("y", "worse"), _finding("b", "hurt", 0.8, family="llama", gpu="A100"))
    rows = mem.similar({"model_family": "gemma", "gpu": "H200", "traits": COND.traits}, exclude_endpoint="demo")
    (row,) = rows
    assert row["disagreement"] and row["outcomes"] == ["helped", "hurt"]
    assert [c["endpoint"] for c in row["cases"]] == ["a", "b"]  # the most similar endpoint first
    lake = finding_rows(mem.findings(), "c1")["findings"]
    assert {r["outcome"] for r in lake} == {"helped", "hurt"} and all(r["technique"] for r in lake)


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def test_memory_is_its_own_repository_never_the_enclosing_checkout(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / "src.py").write_text("x = 1\n")
    _git(checkout, "add", "src.py")
    _git(checkout, "-c", "user.name=dev", "-c", "user.email=dev@x", "commit", "-q", "-m", "source")
    monkeypatch.chdir(checkout)
    mem = Memory("memory")  # a relative folder inside the checkout, as a CLI default would give
    mem.record("demo", _entry("h1", "same"), _finding("demo", "neutral", 1.0))
    assert mem.commit("demo: round 1") is True
    mem.record("demo", _entry("h2", "worse"), None)
    assert mem.commit("demo: round 2") is True
    assert mem.commit("nothing new") is False
    assert _git(checkout, "log", "--format=%s").stdout.split("\n")[0] == "source"
    assert _git(checkout, "rev-list", "--count", "HEAD").stdout.strip() == "1"
    assert _git(checkout / "memory", "rev-parse", "--show-toplevel").stdout.strip() == str((checkout / "memory").resolve())
    history = _git(checkout / "memory", "log", "--format=%an %s").stdout.splitlines()
    assert history == ["autoresearch demo: round 2", "autoresearch demo: round 1"]


def test_a_memory_that_cannot_be_versioned_says_so(tmp_path, monkeypatch):
    mem = Memory(tmp_path / "memory")
    mem.record("demo", _entry("h1", "same"), None)
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    with pytest.raises(MemoryVersionError, match="memory"):
        mem.commit("demo: round 1")
    assert len(mem.entries("demo")) == 1  # the files are written either way


def test_a_torn_line_is_skipped_not_fatal(tmp_path):
    mem = Memory(tmp_path)
    mem.record("demo", _entry("h1", "same"), None)
    with open(mem.endpoint_file("demo"), "a") as f:
        f.write('{"half": \n')
    assert len(mem.entries("demo")) == 1


def test_a_model_given_as_config_json_is_keyed_by_its_model_type(tmp_path):
    from autoresearch_dagster.memory import model_family

    cfg = tmp_path / "acme-support-ft-v3" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text('{"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}')
    assert model_family(str(cfg)) == "qwen" and model_family(str(cfg.parent)) == "qwen"
    arch_only = tmp_path / "ft.json"
    arch_only.write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert model_family(str(arch_only)) == "llama"
    assert model_family("llama-3.1-8b") == "llama" and model_family("meta-llama/Llama-3.1-8B") == "llama"
    assert model_family(str(tmp_path / "missing" / "config.json")) == "config"  # unreadable: the path's name
