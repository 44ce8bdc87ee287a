"""`autoresearch correctness emulate` end to end (the group is registered here directly)."""
from __future__ import annotations

import argparse
import json

from autoresearch_dagster.cli import correctness as cli


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="group"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_emulate_writes_the_measured_result(tmp_path, capsys):
    cand = tmp_path / "cand.yaml"
    cand.write_text("kv_cache_dtype: fp8_e4m3\n")
    rc = _run(["correctness", "emulate", "--candidate-config", str(cand), "--prompts-per-bucket", "1",
               "--long-chars", "200", "--gen-tokens", "8", "--out", str(tmp_path / "out")])
    assert rc == 0
    assert capsys.readouterr().out.startswith("PASS: top-1 agreement")
    res = json.loads((tmp_path / "out" / "correctness.json").read_text())
    assert res["passed"] is True and res["kl_mean"] > 0 and res["n_positions"] > 100
    assert res["calibration"]["emulated"]["candidate_numerics"] == "float32+kv-fp8-e4m3"
