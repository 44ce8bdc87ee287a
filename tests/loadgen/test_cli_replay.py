"""`autoresearch replay capacity|shape` end to end against a capacity-limited local server process."""
import json

import pyarrow.parquet as pq
import pytest

from autoresearch_dagster.cli import main
from autoresearch_dagster.pool.schema import PoolRequest, write_pool

from .helpers import ServerProcess


@pytest.fixture(scope="module")
def limited_server():
    # 4 slots x 50 ms before the first token: ~80 req/s, TTFT explodes above it
    srv = ServerProcess(concurrency=4, service_s=0.05, token_gap_s=0.001)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    rows = [PoolRequest(id=f"q{i}", arrival_s=i * 0.1 if i < 100 else 10 + (i - 100) * 0.025, conversation_id=None,
                        turn=None, api="chat", messages=[{"role": "user", "content": f"question {i}"}], prompt=None,
                        tools=None, tool_choice=None, response_format=None, sampling={"temperature": 0.0},
                        prompt_tokens=3, output_tokens=4, block_hashes=[], block_tokens=64, split="serving")
            for i in range(300)]
    return write_pool(rows, tmp_path_factory.mktemp("pool") / "pool").parent


def test_replay_capacity_cli(limited_server, pool_dir, tmp_path):
    out = tmp_path / "cap"
    rc = main(["replay", "capacity", "--pool", str(pool_dir), "--url", limited_server.url,
               "--sla", "ttft_p99<=250ms,errors<=1%", "--out", str(out), "--step-duration", "1.0",
               "--min-completed", "20", "--start-rps", "20", "--resolution", "0.25", "--warmup", "0.3",
               "--max-steps", "8", "--timeout", "5", "--gpus", "2",
               "--max-send-lag-ms", "50"])  # the shared 2-core test machine is often loaded
    summary = json.loads((out / "summary.json").read_text())
    assert rc == (0 if summary["valid"] else 1)
    assert {"capacity_rps", "capacity_rps_per_gpu", "steps", "valid", "invalid_reasons"} <= set(summary)
    assert 15 <= summary["capacity_rps"] <= 100, summary["capacity_rps"]  # the server's limit is ~80 req/s (less under load)
    assert summary["capacity_rps_per_gpu"] == pytest.approx(summary["capacity_rps"] / 2)
    assert summary["model"] == "fake-model"
    recs = pq.read_table(out / "records.parquet")
    assert recs.num_rows == sum(s["n_sent"] for s in summary["steps"])
    assert (out / "load_curve.csv").read_text().splitlines()[0].startswith('"step_id","rate_rps"')
    assert (out / "load_curve.png").stat().st_size > 10_000


def test_replay_shape_cli(limited_server, pool_dir, tmp_path):
    out = tmp_path / "shape"
    rc = main(["replay", "shape", "--pool", str(pool_dir), "--url", limited_server.url,
               "--sla", "ttft_p99<=250ms", "--out", str(out), "--speedup", "4", "--interval", "2.5", "--timeout", "5"])
    summary = json.loads((out / "summary.json").read_text())
    assert rc in (0, 1) and "replay_capacity" in summary and summary["speedup"] == 4.0
    counts = [i["sent"] for i in summary["intervals"]]
    assert sum(counts) == 300 and counts[0] == 25 and max(counts) == 100  # the burst after t=10 s
    assert (out / "intervals.png").exists() and (out / "records.parquet").exists()


def test_bad_input_is_a_clear_error(pool_dir, tmp_path, capsys):
    assert main(["replay", "capacity", "--pool", str(tmp_path / "nope"), "--url", "http://127.0.0.1:9",
                 "--sla", "ttft_p99<=1s", "--out", str(tmp_path / "o")]) == 2
    assert "no replay pool" in capsys.readouterr().err
    assert main(["replay", "capacity", "--pool", str(pool_dir), "--url", "http://127.0.0.1:9",
                 "--sla", "ttft<=1s", "--out", str(tmp_path / "o")]) == 2
