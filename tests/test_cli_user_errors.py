"""Every user error of the CLI is one line on stderr and exit code 2, never a traceback.

The walk covers each command group's inputs: paths (missing, a directory where a file is expected, a
file where a directory is), SLA strings, option values, unset --api-key-env variables, bad specs,
and argparse's own usage errors.
"""
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch_dagster.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "examples/endpoints/demo.yaml")
CANDIDATE = str(ROOT / "examples/candidates/demo_better.yaml")
UNSET = "AUTORESEARCH_TEST_UNSET_KEY"
GOOD_SLA = "ttft_p99<=3000ms,errors<=1%"


def _replay(tmp: str, *, sla: str = GOOD_SLA, pool: str = "{tmp}/nopool", out: str = "{tmp}/o", mode="capacity"):
    return ["replay", mode, "--pool", pool, "--engine", "emulator", "--endpoint", DEMO, "--sla", sla, "--out", out]


def _build(logs: str = "{log}", out: str = "{tmp}/pool", *extra: str):
    return ["pool", "build", "--logs", logs, "--endpoint", "e", "--out", out, *extra]


CASES = [
    # pool build
    (_build("{tmp}"), "is a directory"),
    (_build("{tmp}/missing.jsonl"), "does not exist"),
    (_build(out="{file}"), "is a file"),
    (_build(out="{tmp}"), "holds files but no replay pool"),
    (_build(out="{file}/pool"), "is a file"),
    (_build("{log}", "{tmp}/pool", "--max-records", "0"), "--max-records must be positive"),
    (_build("{log}", "{tmp}/pool", "--context-length", "1"), "--context-length must be at least 2"),
    (_build("{log}", "{tmp}/pool", "--max-gap-days", "40"), "cannot exceed the longest span"),
    (_build("{log}", "{tmp}/pool", "--tokenizer", "{tmp}"), "is not a file"),
    (_build("{empty}"), "is empty"),
    (["pool", "fidelity", "--pool", "{tmp}/nope"], "no fidelity report"),
    # replay: SLA strings, then paths
    (_replay("{tmp}", sla="ttft_p99<=3"), "needs a unit, ms or s, e.g. '3ms' or '3s'"),
    (_replay("{tmp}", sla="ttft_p99<3000ms"), "only '<=' bounds are allowed"),
    (_replay("{tmp}", sla="ttft_p99<=3000ms,errors<=1"), "the error rate needs a percentage with '%'"),
    (_replay("{tmp}", sla="ttft_p100<=3000ms"), "quantile p100 is outside (0, 100)"),
    (_replay("{tmp}", sla="ttft_p0<=3000ms"), "quantile p0 is outside (0, 100)"),
    (_replay("{tmp}", sla="ttft_p99<=3000ms,ttft_p99<=2s"), "bounds ttft_p99 twice"),
    (_replay("{tmp}", sla="errors<=1%"), "needs at least one latency term"),
    (_replay("{tmp}", sla="ttft_p99<=3000ms,"), "empty term"),
    (_replay("{tmp}"), "no replay pool"),
    (_replay("{tmp}", pool="{file}"), "is not a replay pool"),
    (_replay("{tmp}", pool="{tmp}", mode="shape"), "no replay pool"),
    (_replay("{tmp}", out="{file}"), "is a file"),
    (["replay", "capacity", "--pool", "{tmp}/p", "--url", "http://127.0.0.1:9", "--api-key-env", UNSET,
      "--sla", GOOD_SLA, "--out", "{tmp}/o"], f"the environment variable {UNSET} is not set"),
    (["replay", "capacity", "--pool", "{tmp}/p", "--endpoint", "{tmp}/none.yaml", "--out", "{tmp}/o"],
     "endpoint spec {tmp}/none.yaml does not exist"),
    # specs and candidate files
    (["experiment", "run", "--endpoint", DEMO, "--candidate", "{tmp}/missing.yaml", "--out", "{tmp}/o"],
     "config file {tmp}/missing.yaml does not exist"),
    (["experiment", "run", "--endpoint", DEMO, "--candidate", "{tmp}", "--out", "{tmp}/o"], "is a directory"),
    (["experiment", "run", "--endpoint", "{tmp}", "--candidate", CANDIDATE, "--out", "{tmp}/o"],
     "endpoint spec {tmp} is a directory"),
    (["experiment", "run", "--endpoint", DEMO, "--candidate", CANDIDATE, "--noise", "{tmp}/none.json",
      "--out", "{tmp}/o"], "cannot read capacity_cv"),
    (["experiment", "run", "--endpoint", DEMO, "--candidate", "{badknob}", "--out", "{tmp}/o"], "chunked_prefill_size"),
    (["noise", "--endpoint", "{badsla}", "--out", "{tmp}/o"], "sla: SLA term 'ttft_p99<=3': the bound needs a unit"),
    (["noise", "--endpoint", "{badyaml}", "--out", "{tmp}/o"], "is not valid YAML"),
    (["noise", "--endpoint", DEMO, "--out", "{tmp}/o", "--runs", "2"], "--runs must be at least 5"),
    (["campaign", "run", "--endpoint", "{tmp}", "--out", "{tmp}/c"], "is a directory"),
    (["campaign", "run", "--endpoint", DEMO, "--out", "{tmp}/c", "--budget-experiments", "0"],
     "campaign settings: max_experiments: "),
    (_replay("{tmp}") + ["--resolution", "0"], "measurement setting resolution = 0.0: it must be between 0 and 1"),
    (_replay("{tmp}") + ["--max-steps", "0"], "measurement setting max_steps = 0"),
    (_replay("{tmp}", mode="shape") + ["--speedup", "0"], "--speedup must be > 0"),
    (["emulator", "serve", "--endpoint", DEMO, "--config", "{tmp}", "--port", "0"], "is a directory"),
    (["correctness", "gate", "--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9",
      "--api-key-env", UNSET], f"{UNSET} is not set"),
    (["correctness", "emulate", "--candidate-config", "{tmp}/none.yaml"], "does not exist"),
    (["diagnose", "--endpoint", DEMO, "--pool", "{tmp}/nopool", "--out", "{tmp}/d"], "no replay pool"),
]

USAGE = [
    ["pool", "build", "--logs", "x.jsonl"],  # a required option missing
    ["replay", "capacity", "--pool", "p", "--out", "o", "--measure", "bogus"],  # not a choice
    ["noise", "--endpoint", DEMO, "--out", "o", "--runs", "many"],  # not an integer
    ["pool", "build", "--nonsense"],
]


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.delenv(UNSET, raising=False)
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 1772442000, "request": {"messages": [{"role": "user", "content": "hi"}]}}\n')
    (tmp_path / "afile").write_text("not a directory, not a pool\n")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    spec = Path(DEMO).read_text()
    (tmp_path / "badsla.yaml").write_text(spec.replace('"ttft_p99<=3000ms,tpot_p99<=60ms,errors<=1%"', '"ttft_p99<=3"'))
    (tmp_path / "badyaml.yaml").write_text("name: demo\nsla: [unclosed\n")
    (tmp_path / "badknob.yaml").write_text("chunked_prefill_size: big\n")
    return {"tmp": str(tmp_path), "log": str(log), "file": str(tmp_path / "afile"),
            "empty": str(tmp_path / "empty.jsonl"), "badsla": str(tmp_path / "badsla.yaml"),
            "badyaml": str(tmp_path / "badyaml.yaml"), "badknob": str(tmp_path / "badknob.yaml")}


@pytest.mark.parametrize("argv, message", CASES, ids=[f"{c[0][0]}-{i}" for i, c in enumerate(CASES)])
def test_each_user_error_is_one_line_and_exit_2(argv, message, files, capsys):
    rc = main([a.format(**files) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoresearch: error: "), err
    assert message.format(**files) in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("argv", USAGE)
def test_usage_errors_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and lines[0].endswith("--help)"), err


def test_the_installed_command_exits_2_with_one_line(files):
    for argv in (_replay("{tmp}", sla="ttft_p99<=3"), _build("{tmp}")):
        proc = subprocess.run([sys.executable, "-m", "autoresearch_dagster", *[a.format(**files) for a in argv]],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stdout == ""
