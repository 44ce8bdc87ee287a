"""outputs.files: the one atomic write (no temp file left, mode 0644, old file kept on failure) and the one
JSON cleaner (NaN/inf become null, numpy scalars numbers, the rest plain JSON)."""
import json
import math
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autoresearch_dagster.outputs.files import (FILE_MODE, atomic_write, atomic_write_bytes, atomic_write_text,
                                                json_safe, write_json)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_write_leaves_only_the_target_readable_by_group_and_others(tmp_path):
    target = tmp_path / "new" / "dir" / "out.txt"  # missing parents are created
    assert atomic_write_text(target, "hello\n") == target
    assert target.read_text() == "hello\n"
    assert FILE_MODE == 0o644 and _mode(target) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_atomic_write_replaces_an_existing_file_and_keeps_the_mode_0644(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    target.chmod(0o600)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and _mode(target) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp_file(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_temp_file_is_hidden_and_not_matched_by_the_targets_suffix(tmp_path):
    seen = []
    table = pa.table({"x": [1, 2]})
    atomic_write(tmp_path / "part.parquet", lambda tmp: (seen.append(tmp), pq.write_table(table, tmp)))
    assert seen[0].parent == tmp_path and seen[0].name.startswith(".") and seen[0].suffix == ".tmp"
    assert pq.read_table(tmp_path / "part.parquet").equals(table)


def test_json_safe_turns_non_finite_numbers_into_null():
    assert json_safe({"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": (np.float64("nan"), 2)}) == \
        {"a": None, "b": [None, None, 1.5], "c": [None, 2]}


def test_json_safe_gives_plain_json_types():
    out = json_safe({1: np.int64(3), "f": np.float32(0.5), "ok": np.bool_(True), "p": Path("/x/y"), "n": None})
    assert out == {"1": 3, "f": 0.5, "ok": True, "p": "/x/y", "n": None}
    assert type(out["1"]) is int and type(out["ok"]) is bool


def test_write_json_is_strict_json(tmp_path):
    path = write_json(tmp_path / "s.json", {"b": math.nan, "a": [1, math.inf]}, sort_keys=True)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text and text.endswith("\n")
    assert json.loads(text) == {"a": [1, None], "b": None}
    assert text.index('"a"') < text.index('"b"') and _mode(path) == 0o644
