"""bench_unseen: endpoints drawn from a seed cover the catalog's kinds, and one runs end to end through the CLI."""
from __future__ import annotations

import json

from benchmarks import bench_unseen as bu
from autoresearch_dagster.agents.search import static_problem
from autoresearch_dagster.spec import SLA, load_endpoint, validate_server_config


def test_the_generator_is_deterministic_covers_every_traffic_kind_and_writes_valid_specs(tmp_path):
    n = len(bu.TRAFFIC)  # every trace format and synthetic shape once in a draw of that many
    a, b = bu.generate(97531, n), bu.generate(97531, n)
    assert a == b and bu.generate(97532, n) != a
    assert {u.traffic for u in a} == set(bu.TRAFFIC)
    assert {u.traffic for u in bu.generate(97531, n - 1)} != set(bu.TRAFFIC)
    kinds = {u.sla_kind for s in (11, 12, 13) for u in bu.generate(s, 7)}
    assert kinds == {"ttft+itl", "ttft+tpot", "ttft"}
    for u in a:
        assert u.hidden_seed not in bu.SUITE_HIDDEN_SEEDS
        assert bu._fits(u.model, u.gpu, u.gpus) and not static_problem(u.server_config, u.gpus)
        validate_server_config(u.server_config)
        spec, pool = u.write(tmp_path / u.name)
        ep = load_endpoint(spec)
        assert ep.gpus == u.gpus and ep.sla == SLA.parse(u.sla) and (pool is None) == (u.traffic in bu.TRACES)
        assert ("itl_p99" in u.sla) == (u.sla_kind == "ttft+itl") and ("tpot_p99" in u.sla) == (u.sla_kind == "ttft+tpot")


def test_one_endpoint_end_to_end_campaign_reference_and_table(tmp_path, capsys):
    out = tmp_path / "rows.json"
    # seed 7 draw 1 is a synthetic-pool endpoint with capacity (fast); budget 1, a tiny reference
    assert bu.main(["--seed", "7", "--n", "2", "--only", "1", "--budget-experiments", "1", "--ref-trials", "2",
                    "--grid-max", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "generator seed 7 (given)" in text and "none is the suite's" in text
    [row] = json.loads(out.read_text())
    assert "error" not in row, row.get("error")
    assert row["experiments"] == 1 and len(row["verdicts"]) == 1
    # the reference includes every config the campaign promoted: it is never below the campaign's gain
    assert row["ref_gain"] >= row["gain"] - 1e-9 and row["ref_evaluated"] >= 2
    assert "target: no false 'better'" in text and "medians over 1 scored" in text
