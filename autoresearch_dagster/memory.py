"""Owns the findings memory: plain text files in one directory that is its own git repository.

The directory is initialised as a repository of its own (``git init`` there) before its first commit, so
findings never land in an enclosing checkout (the project's source tree) even when the memory folder lies
inside one. A failure to version raises ``MemoryVersionError``: the files are written either way, and the
campaign logs and records the failure instead of losing it.

Layout (one JSON object per line, append-only, human-diffable):
- ``endpoints/<endpoint>.jsonl``: every config this endpoint tried, with its verdict, evidence and the
  conditions it was tried under (baseline, engine version, pool, hardware, workload traits). A config
  is not rerun against the same baseline while the conditions are unchanged (``tested``).
- ``findings.jsonl``: across endpoints, one finding per experiment, keyed by bottleneck, technique
  (the knob changes), model family, hardware, workload traits and engine version, with its outcome
  (helped / hurt / neutral / invalid) and ratio. ``similar`` returns the findings of the endpoints
  most like a given one, grouped by technique, and marks a technique whose outcomes disagree
  ("helped here, hurt there") instead of averaging: the next round gets both, with their conditions.
- ``probes.jsonl``: which diagnostic probes were useful (written by ``diagnose.probes``).
The lake's ``findings`` table holds the same findings for analysts (``lake_rows``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoresearch_dagster.outputs.files import atomic_write_text
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.emulator.hf_config import ARCHITECTURES, config_path, read_config
from autoresearch_dagster.spec import KNOBS, SpecError, model_is_path

GIT_IDENTITY = {"GIT_AUTHOR_NAME": "autoresearch", "GIT_AUTHOR_EMAIL": "autoresearch@localhost",
                "GIT_COMMITTER_NAME": "autoresearch", "GIT_COMMITTER_EMAIL": "autoresearch@localhost"}


class MemoryVersionError(RuntimeError):
    """The memory's files were written but could not be committed to the memory's own repository."""


README = """# AutoResearch memory

Written by the campaigns (`autoresearch campaign run`, the Dagster loop); one JSON object per line.

- `endpoints/<endpoint>.jsonl`: every config an endpoint tried, its verdict, ratio and the conditions
  (baseline, engine version, pool, hardware, workload traits).
- `findings.jsonl`: one finding per experiment, keyed by bottleneck, technique, model family, GPU,
  workload traits and engine version; outcomes that disagree across endpoints are kept side by side.
- `probes.jsonl`: which diagnostic probes were useful on which kind of endpoint.
"""


def model_family(model: str) -> str:
    """The family findings are keyed by: the leading letters of the model's name ("llama-3.1-8b" -> llama), or,
    for a model given as a config.json, of its ``model_type`` (else ``architectures[0]``): a fine-tune's file
    name says nothing about its family."""
    name = (model or "").lower().split("/")[-1]
    if model and model_is_path(model):
        try:
            cfg = read_config(config_path(model))
            arch = str((cfg.get("architectures") or [""])[0])
            name = str(cfg.get("model_type") or ARCHITECTURES.get(arch, arch)).lower() or name
        except SpecError:
            pass  # an unreadable config keeps its path's name; the spec check reports the file itself
    m = re.match(r"[a-z]+", name)
    return m.group(0) if m else (model or "unknown")


@dataclass(frozen=True)
class Conditions:
    """What a result depends on besides the config: a change here makes an old result stale."""
    engine: str
    engine_version: str
    model: str
    gpu: str
    gpus: int
    pool_hash: str
    traits: dict[str, float]  # workload: mean prompt/output tokens, prefix hit rate, inter-arrival CV

    @property
    def model_family(self) -> str:
        return model_family(self.model)

    def key(self) -> str:
        """Equal keys mean a config tried under these conditions need not be tried again."""
        blob = json.dumps([self.engine, self.engine_version, self.model, self.gpu, self.gpus, self.pool_hash])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def technique(delta: dict[str, Any]) -> str:
    """A change as a stable key: ``knob=value`` pairs in knob order (aliases resolved)."""
    return ",".join(f"{k}={KNOBS[k].canonical(delta[k]) if k in KNOBS else delta[k]}"
                    for k in sorted(delta, key=lambda k: (list(KNOBS).index(k) if k in KNOBS else 999, k)))


def outcome(verdict: str) -> str:
    return {"better": "helped", "worse": "hurt", "same": "neutral"}.get(verdict, "invalid")


def similarity(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How alike two endpoints are, 0..3: model family, GPU, workload traits."""
    s = (1.0 if a.get("model_family") == b.get("model_family") else 0.0)
    s += 0.5 if a.get("gpu") == b.get("gpu") else 0.0
    ta, tb = a.get("traits") or {}, b.get("traits") or {}
    for key, scale in (("mean_prompt_tokens", 3.0), ("mean_output_tokens", 3.0)):
        x, y = ta.get(key), tb.get(key)
        if x and y and x > 0 and y > 0:
            s += 0.5 * max(0.0, 1 - abs(math.log(x / y)) / scale)
    for key in ("prefix_hit_rate",):
        x, y = ta.get(key), tb.get(key)
        if x is not None and y is not None:
            s += 0.5 * max(0.0, 1 - abs(x - y))
    return round(s, 3)


class Memory:
    """The memory directory (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _ensure(self) -> None:
        (self.root / "endpoints").mkdir(parents=True, exist_ok=True)
        if not (self.root / "README.md").exists():
            atomic_write_text(self.root / "README.md", README)

    @staticmethod
    def _read(path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line of another writer: skipped, never fatal
            if isinstance(row, dict):
                out.append(row)
        return out

    def _append(self, path: Path, rows: list[dict[str, Any]]) -> None:
        self._ensure()
        old = path.read_text() if path.exists() else ""
        atomic_write_text(path, old + "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))

    def endpoint_file(self, endpoint: str) -> Path:
        return self.root / "endpoints" / f"{endpoint}.jsonl"

    def entries(self, endpoint: str) -> list[dict[str, Any]]:
        return self._read(self.endpoint_file(endpoint))

    def findings(self) -> list[dict[str, Any]]:
        return self._read(self.root / "findings.jsonl")

    def record(self, endpoint: str, entry: dict[str, Any], finding: dict[str, Any] | None) -> None:
        """One tried config (and, when it taught something, its finding)."""
        stamp = utc_now().isoformat()
        self._append(self.endpoint_file(endpoint), [{**entry, "recorded_at": stamp}])
        if finding is not None:
            self._append(self.root / "findings.jsonl", [{**finding, "recorded_at": stamp}])

    def tested(self, endpoint: str, baseline_hash: str, conditions: Conditions) -> dict[str, str]:
        """Candidate config hash -> why it is not run again: tried against this baseline under these
        conditions with nothing to gain (same, worse, invalid). An engine upgrade, another pool or other
        hardware makes it worth another try; a remembered "better" is worth a fresh confirmation."""
        key = conditions.key()
        out = {}
        for e in self.entries(endpoint):
            if (e.get("baseline_hash") == baseline_hash and e.get("conditions_key") == key and e.get("candidate_hash")
                    and e.get("verdict") != "better"):
                out[e["candidate_hash"]] = (f"{e.get('verdict')} in {e.get('experiment_id')} "
                                            f"(campaign {e.get('campaign_id')}, {str(e.get('recorded_at', ''))[:10]})")
        return out

    def gate_failures(self, endpoint: str) -> dict[str, list[str]]:
        """Experiment id -> the lossy settings whose candidate failed the correctness gate on this endpoint
        (the gate judges numerics, which no later baseline or engine upgrade of the endpoint changes)."""
        return {e["experiment_id"]: e["gate_failed"] for e in self.entries(endpoint) if e.get("gate_failed")}

    def similar(self, profile: dict[str, Any], *, k: int = 8, exclude_endpoint: str | None = None) -> list[dict[str, Any]]:
        """Findings of the most similar endpoints, one row per technique: its outcomes side by side (with
        the conditions of each), ``disagreement`` when they differ."""
        rows = [f for f in self.findings() if f.get("endpoint") != exclude_endpoint]
        by_tech: dict[str, list[dict[str, Any]]] = {}
        for f in rows:
            f = {**f, "similarity": similarity(profile, f)}
            by_tech.setdefault(f.get("technique", ""), []).append(f)
        out = []
        for tech, fs in by_tech.items():
            fs.sort(key=lambda f: -f["similarity"])
            outcomes = sorted({f.get("outcome") for f in fs if f.get("outcome") != "invalid"})
            out.append({"technique": tech, "similarity": fs[0]["similarity"], "outcomes": outcomes,
                        "disagreement": len(outcomes) > 1,
                        "cases": [{k2: f.get(k2) for k2 in ("endpoint", "outcome", "ratio", "bottleneck", "model_family",
                                                              "gpu", "engine_version", "traits", "experiment_id")}
                                  for f in fs[:4]]})
        out.sort(key=lambda r: (-r["similarity"], r["technique"]))
        return out[:k]

    def _git(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-c", "commit.gpgsign=false", "-C", str(self.root), *args], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **GIT_IDENTITY})

    def ensure_repo(self) -> None:
        """Make the memory directory the top of a git repository of its own (``git init`` there unless it already
        is one): a memory folder inside another checkout must not commit into that checkout."""
        self._ensure()
        top = self._git("rev-parse", "--show-toplevel", timeout=10)
        if top.returncode == 0 and Path(top.stdout.strip()).resolve() == self.root.resolve():
            return
        done = self._git("init", "-q")
        if done.returncode != 0:
            raise MemoryVersionError(f"git init {self.root} failed: {done.stderr.strip() or done.returncode}")

    def commit(self, message: str) -> bool:
        """``git add`` + ``git commit`` everything in the memory's own repository (created on first use): True
        when committed, False when nothing changed. Raises ``MemoryVersionError`` when versioning fails (no
        git, a broken repository); the files are written either way."""
        try:
            self.ensure_repo()
            if not self._git("status", "--porcelain").stdout.strip():
                return False
            for args in (("add", "--", "."), ("commit", "-q", "-m", message)):
                done = self._git(*args)
                if done.returncode != 0:
                    raise MemoryVersionError(f"git {args[0]} in {self.root} failed: "
                                             f"{(done.stderr or done.stdout).strip() or done.returncode}")
            return True
        except (OSError, subprocess.SubprocessError) as e:
            raise MemoryVersionError(f"cannot version the memory in {self.root}: {e}") from e


def finding_rows(findings: list[dict[str, Any]], campaign_id: str | None) -> dict[str, list[dict[str, Any]]]:
    """The lake's ``findings`` rows for these findings."""
    now = utc_now()
    return {"findings": [{"finding_id": f"f-{f.get('experiment_id')}", "campaign_id": campaign_id,
                          "kind": f.get("outcome"), "title": f"{f.get('technique')} {f.get('outcome')} "
                                                              f"({f.get('bottleneck') or 'no bottleneck'})",
                          "detail_json": json.dumps(f, sort_keys=True, default=str), "technique": f.get("technique"),
                          "bottleneck": f.get("bottleneck"), "model_family": f.get("model_family"),
                          "gpu": f.get("gpu"), "engine_version": f.get("engine_version"),
                          "outcome": f.get("outcome"), "ratio": f.get("ratio"), "recorded_at": now}
                         for f in findings]}

