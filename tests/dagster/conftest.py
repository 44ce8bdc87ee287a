"""Fixtures for the Dagster tests: an isolated instance, endpoint spec dirs, definitions over tmp dirs."""
import shutil
import warnings
from pathlib import Path

import dagster as dg
import pytest

from autoresearch_dagster.definitions import build_defs
from resources import MeasurementSettings

ROOT = Path(__file__).resolve().parents[2]
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)


def write_spec(spec_dir: Path, name: str, logs: list[Path]) -> Path:
    text = (ROOT / "examples/endpoints/demo.yaml").read_text().replace("name: demo", f"name: {name}")
    text = text.replace("logs: [../logs/demo_chat.jsonl]", f"logs: [{', '.join(str(p) for p in logs)}]")
    path = spec_dir / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def instance():
    """In-memory instance: automation ticks on it take ~1 s instead of several on SQLite files."""
    inst = dg.DagsterInstance.ephemeral()
    yield inst
    inst.dispose()


@pytest.fixture
def project(tmp_path):
    """A spec dir with one endpoint 'ep1' over a copy of the demo logs, plus out/ and candidates/."""
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(ROOT / "examples/logs/demo_chat.jsonl", logs / "chat.jsonl")
    spec_dir = tmp_path / "endpoints"
    spec_dir.mkdir()
    write_spec(spec_dir, "ep1", [logs / "chat.jsonl"])
    (tmp_path / "candidates").mkdir()
    return tmp_path


def make_defs(project: Path, settings: MeasurementSettings | None = None) -> dg.Definitions:
    return build_defs(out_dir=str(project / "out"), spec_dir=str(project / "endpoints"),
                      candidates_dir=str(project / "candidates"), settings=settings)
