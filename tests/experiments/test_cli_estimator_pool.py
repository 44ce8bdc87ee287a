"""CLI: `--estimator` reaches the statistics and the outputs; a pool built from logs is reused so campaigns repeat."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from autoresearch_dagster.cli import main
from autoresearch_dagster.pool.redact import KEY_ENV
from autoresearch_dagster.results import ResultsLake

from .helpers import SMALL

DEMO_LOG = Path(__file__).resolve().parents[2] / "examples" / "logs" / "demo_chat.jsonl"


@pytest.fixture
def endpoint_with_logs(tmp_path):
    logs = tmp_path / "logs" / "chat.jsonl"
    logs.parent.mkdir()
    with DEMO_LOG.open() as f:
        logs.write_text("".join(next(f) for _ in range(60)))
    ep = tmp_path / "ep.yaml"
    ep.write_text(yaml.safe_dump({"name": "demo", "model": "gemma-moe-26b-a4b", "hardware": {"gpu": "H200", "count": 1},
                                  "sla": "ttft_p99<=1000ms,errors<=1%", "server_config": {},
                                  "workload": {"logs": ["logs/chat.jsonl"]}}))
    return ep, logs


def _noise(ep: Path, tmp: Path, name: str, *extra: str) -> dict:
    assert main(["noise", "--endpoint", str(ep), "--out", str(tmp / name), "--lake", str(tmp / "lake"),
                 "--runs", "5", *SMALL, *extra]) == 0
    return json.loads((tmp / name / "noise.json").read_text())


def _campaigns(tmp: Path) -> list[str]:
    return [r[0] for r in ResultsLake(tmp / "lake").query("SELECT campaign_id FROM campaigns ORDER BY created_at")]


def test_repeated_cli_runs_on_unchanged_logs_share_one_pool_and_campaign(endpoint_with_logs, fake_engine, tmp_path,
                                                                         capsys, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    ep, logs = endpoint_with_logs
    first = _noise(ep, tmp_path, "n1")
    assert "built replay pool" in capsys.readouterr().out
    second = _noise(ep, tmp_path, "n2", "--estimator", "search")
    assert "reusing replay pool" in capsys.readouterr().out
    assert first["estimator"] == "interp" and second["estimator"] == "search"
    lake = ResultsLake(tmp_path / "lake")
    assert len(_campaigns(tmp_path)) == 1
    assert lake.query("SELECT count(DISTINCT campaign_id), count(*) FROM runs") == [(1, 10)]
    assert "_pools" not in {r[0] for r in lake.query("SELECT table_name FROM information_schema.tables")}

    os.utime(logs, ns=(logs.stat().st_atime_ns, logs.stat().st_mtime_ns + 10**9))  # the logs changed
    _noise(ep, tmp_path, "n3")
    assert "built replay pool" in capsys.readouterr().out
    assert len(set(_campaigns(tmp_path))) == 2  # a fresh random key -> a new pool hash -> a new campaign


def test_with_the_key_set_the_pool_is_rebuilt_deterministically_and_the_key_is_never_written(
        endpoint_with_logs, fake_engine, tmp_path, capsys, monkeypatch):
    secret = "redaction-key-that-must-not-leak-7f3a"
    monkeypatch.setenv(KEY_ENV, secret)
    ep, _ = endpoint_with_logs
    _noise(ep, tmp_path, "n1")
    _noise(ep, tmp_path, "n2")
    out = capsys.readouterr().out
    assert out.count("built replay pool") == 2 and "reusing" not in out and secret not in out
    assert len(_campaigns(tmp_path)) == 1  # same key, same logs -> same pool hash
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_estimator_flag_selects_the_verdict_statistic_and_is_recorded(files, fake_engine):
    ep, cand, _, tmp_path = files
    verdicts = {}
    for est in ("interp", "search"):
        assert main(["experiment", "run", "--endpoint", str(ep), "--candidate", str(cand), "--pool",
                     str(tmp_path / "pool"), "--out", str(tmp_path / est), "--no-lake", "--repeats", "3",
                     "--max-repeats", "3", "--no-confirm", "--estimator", est, *SMALL]) == 0
        verdicts[est] = json.loads((tmp_path / est / "verdict.json").read_text())
    i, s = verdicts["interp"], verdicts["search"]
    assert (i["estimator"], i["metric"]) == ("interp", "capacity_interp_rps")
    assert (s["estimator"], s["metric"]) == ("search", "capacity_rps")
    assert {st["estimator"] for st in i["stages"]} == {"interp"}
    assert {st["estimator"] for st in s["stages"]} == {"search"}
    runs = json.loads((tmp_path / "search" / "experiment.json").read_text())["runs"]
    assert s["capacities_baseline"] == [r["capacity_rps"] for r in runs if r["arm"] == "baseline" and r["valid"]]
    assert i["capacities_baseline"] != s["capacities_baseline"]  # interp values are not the search's grid points
    assert i["verdict"] == s["verdict"] == "better"  # a 20% gain at CV 2% under either statistic
    with pytest.raises(SystemExit):
        main(["noise", "--endpoint", str(ep), "--out", str(tmp_path), "--estimator", "mean"])
