"""Fixtures for pool tests: small generated logs and the demo pool built once per session."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoresearch_dagster.pool.build import build_pool

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "logs" / "demo_chat.jsonl"


def chat_line(ts, content="Hello there, how are you today?", **extra) -> str:
    rec = {"timestamp": ts, "request": {"model": "m", "messages": [{"role": "user", "content": content}],
                                        "max_tokens": 32}}
    rec.update(extra)
    return json.dumps(rec)


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((l if isinstance(l, bytes) else l.encode()) + b"\n" for l in lines))
    return path


@pytest.fixture(scope="session")
def demo_pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "pool"
    return build_pool([DEMO], "demo", out, key=b"test-key", workers=1)
