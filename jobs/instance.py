"""Owns the Dagster instance of the project and single in-process runs: DAGSTER_HOME's dagster.yaml
rendered from ``dagster_home/<storage>/`` (with the GPU slots of the ``gpu`` pool), the persistent
instance, one run of the asset job for one endpoint partition, and one observation of the engine version."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import dagster as dg

from autoresearch_dagster.definitions import OBSERVE_ENGINE_JOB, PROJECT_ROOT
from autoresearch_dagster.outputs.files import atomic_write_text
from autoresearch_dagster.spec import SpecError
from sensors.orphans import HOST_TAG

# Dagster's console logger stays quiet in the main job: its driver reports each run itself
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


STORAGE_TEMPLATES = PROJECT_ROOT / "dagster_home"


def gpu_slots() -> int:
    """The slots of the ``gpu`` pool: AUTORESEARCH_GPU_SLOTS, else the NVIDIA GPUs this host sees
    (CUDA_VISIBLE_DEVICES when set, else ``nvidia-smi -L``), else 1 (an emulated endpoint's one GPU)."""
    if raw := os.environ.get("AUTORESEARCH_GPU_SLOTS"):
        try:
            slots = int(raw)
        except ValueError:
            slots = -1
        if slots < 1:
            raise SpecError(f"AUTORESEARCH_GPU_SLOTS={raw!r}: the GPU slots must be a whole number >= 1")
        return slots
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return max(1, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))
    return 1


def prepare_dagster_home(home: str | Path | None = None, storage: str | None = None) -> Path:
    """Render ``$DAGSTER_HOME/dagster.yaml`` from ``dagster_home/<storage>/dagster.yaml``.

    ``storage`` defaults to AUTORESEARCH_DAGSTER_STORAGE, else ``sqlite``; DAGSTER_HOME defaults to
    the project-local ``.dagster_home``; the ``gpu`` pool's default limit is ``gpu_slots()``.
    dagster.yaml has no conditionals and an unset ``{env: X}`` fails at load, so the optional Postgres
    password line is dropped when DAGSTER_PG_PASSWORD is unset.
    """
    home = Path(home or os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home").resolve()
    storage = storage or os.environ.get("AUTORESEARCH_DAGSTER_STORAGE", "sqlite")
    template = STORAGE_TEMPLATES / storage / "dagster.yaml"
    if not template.exists():
        raise SpecError(f"unknown instance storage {storage!r}; choose one of: "
                         f"{', '.join(sorted(p.name for p in STORAGE_TEMPLATES.iterdir() if p.is_dir()))}")
    text = template.read_text().replace("{gpu_slots}", str(gpu_slots()))
    if storage == "postgres":
        missing = [v for v in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USERNAME", "DAGSTER_PG_DB")
                   if not os.environ.get(v)]
        if missing:
            raise SpecError(f"Postgres instance storage needs {', '.join(missing)} "
                             "(eval \"$(bash scripts/pg.sh start)\" starts a throwaway cluster)")
        if "DAGSTER_PG_PASSWORD" not in os.environ:
            text = "\n".join(line for line in text.splitlines() if "DAGSTER_PG_PASSWORD}" not in line) + "\n"
    atomic_write_text(home / "dagster.yaml", text)
    return home


def instance(home: str | Path | None = None, storage: str | None = None) -> dg.DagsterInstance:
    """A persistent instance at the rendered DAGSTER_HOME (what `dagster dev` will show)."""
    return dg.DagsterInstance.from_config(str(prepare_dagster_home(home, storage)))


def execute(defs: dg.Definitions, instance: dg.DagsterInstance, partition: str, assets: list[dg.AssetKey], *,
            checks: list[dg.AssetCheckKey] | None = None, run_config: dict | None = None,
            tags: dict[str, str] | None = None, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """One real run of the project's asset job for one endpoint partition: the selected assets with
    their checks (or exactly ``checks`` when given), recorded in ``instance``."""
    job = defs.resolve_implicit_global_asset_job_def()
    if checks is not None:
        job = job.get_subset(asset_selection=set(assets), asset_check_selection=set(checks))
        assets = None
    return job.execute_in_process(instance=instance, partition_key=partition, asset_selection=assets,
                                  run_config=run_config, tags={**(tags or {}), HOST_TAG: socket.gethostname()},
                                  raise_on_error=raise_on_error)


def observe_engine_version(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """One observation run of the engine_version source asset."""
    return defs.resolve_job_def(OBSERVE_ENGINE_JOB).execute_in_process(instance=instance, run_config=QUIET,
                                                                       tags={HOST_TAG: socket.gethostname()})


if __name__ == "__main__":
    # `python -m jobs.instance` renders $DAGSTER_HOME/dagster.yaml (e.g. before `dagster dev`)
    print(prepare_dagster_home())
