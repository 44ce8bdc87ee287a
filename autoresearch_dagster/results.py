"""Owns the results lake: append-only Parquet tables (hive-style by endpoint) and the DuckDB views over them.

Layout: ``<root>/<table>/endpoint=<name>/part-<uuid>.parquet``. Every write is a new file, written
to a hidden temp name in the same directory and ``os.replace``d into place, so readers never see
a partial file. Each table has one owner module (see ``TABLE_OWNERS``); this module only stores.

``<root>/analytics.duckdb`` holds only ``CREATE VIEW``s over ``read_parquet(<glob>,
hive_partitioning=true, union_by_name=true)``. The globs are evaluated at query time, so new
Parquet files show up without refreshing; a refresh (needed only when the view definitions
change) builds a new database file beside the old one and renames it over it. Writers therefore
never hold the DuckDB file, and any number of analysts (``autoresearch sql``, the ``duckdb`` CLI,
Python) can read while a campaign writes. Each table directory also holds one zero-row file of
the declared schema under ``endpoint=_schema`` (not a valid endpoint name), so a view is typed
and queryable before any data exists; an outdated schema file (a column added since) is rewritten and
the views rebuilt when the lake is opened. Directories starting with ``_`` or ``.`` are not tables
(``_pools`` holds replay pools the CLI built from logs).
"""
from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from autoresearch_dagster.outputs.files import atomic_write
from autoresearch_dagster.spec import SpecError

SCHEMA_PARTITION = "_schema"
DB_NAME = "analytics.duckdb"
POOLS_DIR = "_pools"  # replay pools the CLI built from logs; directories starting with _ or . are not tables

_S, _F, _I, _B = pa.string(), pa.float64(), pa.int64(), pa.bool_()
_TS = pa.timestamp("us", tz="UTC")
_LS, _LF = pa.list_(pa.string()), pa.list_(pa.float64())


def utc_now() -> dt.datetime:
    """The timestamp every lake row records (timezone-aware UTC, as the ``_TS`` columns store)."""
    return dt.datetime.now(dt.timezone.utc)


def _schema(*cols: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t) for n, t in cols])


# The documented schema. Columns beyond these are allowed (views union by name); JSON columns end in _json.
TABLES: dict[str, pa.Schema] = {
    "endpoints": _schema(("name", _S), ("model", _S), ("gpu", _S), ("gpus", _I), ("sla", _S),
                         ("engine", _S), ("spec_json", _S), ("recorded_at", _TS)),
    "configs": _schema(("config_hash", _S), ("config_json", _S), ("lossy", _B), ("source", _S),
                       ("recorded_at", _TS)),
    "campaigns": _schema(("campaign_id", _S), ("pool_hash", _S), ("sla", _S), ("sla_hash", _S),
                         ("correctness_hash", _S), ("original_config_hash", _S),
                         ("original_config_json", _S), ("engine", _S), ("gpus", _I), ("engine_version", _S),
                         ("created_at", _TS)),
    "runs": _schema(("run_id", _S), ("experiment_id", _S), ("campaign_id", _S), ("purpose", _S),
                    ("arm", _S), ("run_index", _I), ("seed", _I), ("config_hash", _S), ("engine", _S),
                    ("engine_version", _S), ("gpus", _I), ("capacity_rps", _F), ("capacity_rps_per_gpu", _F),
                    ("replay_capacity", _F), ("capacity_interp_rps", _F), ("valid", _B), ("invalid_reasons", _LS),
                    ("server_info_json", _S), ("timings_json", _S), ("started_at", _TS), ("duration_s", _F),
                    ("gpu_seconds", _F), ("gpus_held", _F)),
    "load_steps": _schema(("run_id", _S), ("experiment_id", _S), ("step_index", _I), ("step_id", _S),
                          ("kind", _S), ("rate_rps", _F), ("offered_rps", _F), ("n_sent", _I), ("achieved_rps", _F), ("goodput_rps", _F),
                          ("error_rate", _F), ("ttft_p50_ms", _F), ("ttft_p95_ms", _F), ("ttft_p99_ms", _F),
                          ("itl_p50_ms", _F), ("itl_p95_ms", _F), ("itl_p99_ms", _F),
                          ("tpot_p50_ms", _F), ("tpot_p95_ms", _F), ("tpot_p99_ms", _F),
                          ("e2e_p50_ms", _F), ("e2e_p95_ms", _F), ("e2e_p99_ms", _F),
                          ("sla_attainment", _F), ("send_lag_p99_ms", _F), ("duration_s", _F),
                          ("meets_sla", _B), ("failed_terms", _LS), ("queue_growth", _B),
                          ("valid", _B), ("invalid_reasons", _LS), ("arrival_seed", _I), ("start_index", _I),
                          ("burstiness", _F)),
    "requests_summary": _schema(("run_id", _S), ("experiment_id", _S), ("step_id", _S), ("n_sent", _I),
                                ("n_ok", _I), ("n_failed", _I), ("n_timeout", _I), ("error_rate", _F),
                                ("achieved_rps", _F), ("goodput_rps", _F)),
    "experiments": _schema(("experiment_id", _S), ("campaign_id", _S), ("kind", _S), ("parent_id", _S),
                           ("mode", _S), ("baseline_hash", _S), ("candidate_hash", _S),
                           ("candidate_json", _S), ("lossy", _B), ("verdict", _S), ("confirmed", _B),
                           ("ratio_median", _F), ("ci_low", _F), ("ci_high", _F), ("margin", _F),
                           ("noise_cv", _F), ("runs_baseline", _I), ("runs_candidate", _I),
                           ("invalid_reasons", _LS), ("correctness_json", _S), ("reason", _S),
                           ("started_at", _TS), ("finished_at", _TS), ("gpu_seconds", _F),
                           ("shared_control_runs", _I), ("comparisons", _I), ("demand_gpu_seconds_ratio", _F),
                           ("demand_gpu_seconds_ratio_ci_low", _F), ("demand_gpu_seconds_ratio_ci_high", _F),
                           ("demand_mean_gpus_saved", _F)),
    "verdicts": _schema(("verdict_id", _S), ("experiment_id", _S), ("stage", _S), ("metric", _S),
                        ("verdict", _S), ("ratio_median", _F), ("ci_low", _F), ("ci_high", _F),
                        ("margin", _F), ("noise_cv", _F), ("n_baseline", _I), ("n_candidate", _I),
                        ("p_value", _F), ("equivalence_shown", _B), ("underpowered", _B), ("reason", _S),
                        ("ci_method", _S), ("baseline_values", _LF), ("candidate_values", _LF),
                        ("decided_at", _TS)),
    "baselines": _schema(("campaign_id", _S), ("config_hash", _S), ("config_json", _S), ("reason", _S),
                         ("source_experiment_id", _S), ("capacity_rps_per_gpu", _F), ("recorded_at", _TS)),
    "noise": _schema(("noise_id", _S), ("campaign_id", _S), ("config_hash", _S), ("engine", _S),
                     ("engine_version", _S), ("runs", _I), ("capacities", _LF), ("median", _F),
                     ("capacity_cv", _F), ("ci_low", _F), ("ci_high", _F), ("reference_rps", _F),
                     ("latency_spread_json", _S), ("measured_at", _TS)),
    "findings": _schema(("finding_id", _S), ("campaign_id", _S), ("kind", _S), ("title", _S),
                        ("detail_json", _S), ("technique", _S), ("bottleneck", _S), ("model_family", _S),
                        ("gpu", _S), ("engine_version", _S), ("outcome", _S), ("ratio", _F), ("recorded_at", _TS)),
    "proposals": _schema(("proposal_id", _S), ("campaign_id", _S), ("round", _I), ("proposer", _S), ("source", _S),
                         ("direction", _S), ("kind", _S), ("question", _S), ("explanation", _S),
                         ("intervention_json", _S), ("candidate_hash", _S), ("predicted_ratio", _F), ("ratio_low", _F),
                         ("ratio_high", _F), ("confidence", _F), ("latency_json", _S), ("falsification", _S),
                         ("trace_path", _S), ("status", _S), ("reasons", _LS), ("recorded_at", _TS)),
    "predictions": _schema(("proposal_id", _S), ("experiment_id", _S), ("campaign_id", _S), ("round", _I),
                           ("proposer", _S), ("direction", _S), ("kind", _S), ("predicted_ratio", _F),
                           ("ratio_low", _F), ("ratio_high", _F), ("verdict", _S), ("measured_ratio", _F),
                           ("margin", _F), ("scored", _B), ("predicted_direction", _S), ("measured_direction", _S),
                           ("direction_hit", _B), ("covered", _B), ("abs_log_error", _F), ("recorded_at", _TS)),
    "calibrations": _schema(("version", _I), ("engine", _S), ("engine_version", _S), ("model", _S), ("gpu", _S),
                            ("config_hash", _S), ("pool_hash", _S), ("reason", _S), ("source", _S),
                            ("params_json", _S), ("efficiency_json", _S), ("error_before", _F), ("error_after", _F),
                            ("points", _I), ("success", _B), ("path", _S), ("detail_json", _S), ("created_at", _S)),
    "emulator_errors": _schema(("experiment_id", _S), ("proposal_id", _S), ("campaign_id", _S), ("round", _I),
                               ("era", _I), ("knobs", _LS), ("families", _LS), ("family", _S), ("emulated_ratio", _F),
                               ("measured_ratio", _F), ("ci_low", _F), ("ci_high", _F), ("log_error", _F),
                               ("abs_log_error", _F), ("verdict", _S), ("emulated_baseline_rps", _F),
                               ("emulated_candidate_rps", _F), ("calibration_version", _I), ("surrogate_model", _S),
                               ("recorded_at", _TS)),
    "campaign_results": _schema(("campaign_id", _S), ("ended_because", _S), ("original_capacity_rps", _F),
                                ("final_capacity_rps", _F), ("original_rps_per_gpu", _F), ("final_rps_per_gpu", _F),
                                ("gain", _F), ("gain_ci_low", _F), ("gain_ci_high", _F), ("lossy", _B),
                                ("experiments", _I), ("gpu_hours", _F), ("hit_rate", _F), ("coverage", _F),
                                ("best_config_json", _S), ("review_path", _S), ("finished_at", _TS),
                                ("demand_gpu_seconds_ratio", _F), ("demand_mean_gpus_saved", _F)),
    "approvals": _schema(("approval_id", _S), ("campaign_id", _S), ("config_hash", _S), ("decision", _S),
                         ("who", _S), ("note", _S), ("review_path", _S), ("run_id", _S), ("package_hash", _S),
                         ("deploy_path", _S), ("recorded_at", _TS)),
    "production_fidelity": _schema(("check_id", _S), ("pool_hash", _S), ("config_hash", _S),
                                   ("engine_version", _S), ("property", _S), ("unit", _S), ("production", _F),
                                   ("replay", _F), ("drift", _F), ("drift_limit", _F), ("passed", _B), ("skipped", _S),
                                   ("recorded_at", _TS)),
    "autoscaling": _schema(("replay_id", _S), ("role", _S), ("replay", _S), ("run_id", _S), ("experiment_id", _S),
                           ("campaign_id", _S), ("config_hash", _S), ("engine", _S), ("speedup", _F),
                           ("gpus_per_replica", _I), ("window_s", _F), ("gpu_seconds", _F), ("mean_replicas", _F),
                           ("replicas_min", _F), ("replicas_max", _F), ("scale_ups", _I), ("scale_downs", _I),
                           ("scale_up_latency_median_s", _F), ("scale_up_latency_max_s", _F), ("burst_rule", _S),
                           ("burst_s", _F), ("burst_requests", _I), ("burst_sla_misses", _I), ("other_requests", _I),
                           ("other_sla_misses", _I), ("baseline_replay_id", _S), ("gpu_seconds_ratio", _F),
                           ("mean_gpus_saved", _F), ("series_t_s", _LF), ("series_replicas", _LF),
                           ("series_ready", _LF), ("series_desired", _LF), ("recorded_at", _TS)),
}

TABLE_OWNERS = ({t: "autoresearch_dagster.experiments.runs" for t in ("runs", "load_steps", "requests_summary")}
                | {t: "autoresearch_dagster.experiments.campaign"
                   for t in ("endpoints", "configs", "campaigns", "baselines")}
                | {t: "autoresearch_dagster.experiments.experiment" for t in ("experiments", "verdicts")}
                | {"noise": "autoresearch_dagster.experiments.noise", "findings": "autoresearch_dagster.memory",
                   "calibrations": "autoresearch_dagster.emulator.calibrations",
                   "emulator_errors": "autoresearch_dagster.campaign.loop"}
               | {t: "autoresearch_dagster.campaign.loop" for t in ("proposals", "predictions", "campaign_results")}
               | {"approvals": "autoresearch_dagster.campaign.review",
                  "production_fidelity": "autoresearch_dagster.experiments.production_replay",
                  "autoscaling": "autoresearch_dagster.measure.autoscaling"})

# Question views: analysts' common questions, defined over the table views. The interp columns use
# a run's search capacity where it had no SLA crossing to interpolate, as verdicts do (RunRecord.value).
QUESTION_VIEWS = {
    "capacity_by_config": """
        SELECT endpoint, campaign_id, config_hash, count(*) AS runs,
               median(capacity_rps) AS capacity_rps_median,
               median(capacity_rps_per_gpu) AS capacity_rps_per_gpu_median,
               min(capacity_rps) AS capacity_rps_min, max(capacity_rps) AS capacity_rps_max,
               stddev_samp(capacity_rps) / nullif(avg(capacity_rps), 0) AS capacity_cv,
               count(capacity_interp_rps) AS runs_interp,
               median(coalesce(capacity_interp_rps, capacity_rps)) AS capacity_interp_rps_median,
               median(coalesce(capacity_interp_rps, capacity_rps) / nullif(gpus, 0))
                   AS capacity_interp_rps_per_gpu_median,
               stddev_samp(coalesce(capacity_interp_rps, capacity_rps))
                   / nullif(avg(coalesce(capacity_interp_rps, capacity_rps)), 0) AS capacity_interp_cv
        FROM runs WHERE valid AND capacity_rps IS NOT NULL
        GROUP BY ALL""",
    "campaign_gain": """
        WITH cap AS (
            SELECT endpoint, campaign_id, config_hash,
                   median(capacity_rps_per_gpu) AS cap_per_gpu, count(*) AS runs
            FROM runs WHERE valid AND capacity_rps_per_gpu IS NOT NULL GROUP BY ALL),
        latest AS (
            SELECT endpoint, campaign_id, arg_max(config_hash, recorded_at) AS current_config_hash,
                   max(recorded_at) AS current_since
            FROM baselines GROUP BY ALL)
        SELECT c.endpoint, c.campaign_id, c.sla, c.original_config_hash, o.cap_per_gpu AS original_rps_per_gpu,
               coalesce(l.current_config_hash, c.original_config_hash) AS current_config_hash,
               coalesce(n.cap_per_gpu, o.cap_per_gpu) AS current_rps_per_gpu,
               coalesce(n.cap_per_gpu, o.cap_per_gpu) / nullif(o.cap_per_gpu, 0) AS gain,
               l.current_since
        FROM campaigns c
        LEFT JOIN cap o ON o.endpoint = c.endpoint AND o.campaign_id = c.campaign_id
                       AND o.config_hash = c.original_config_hash
        LEFT JOIN latest l ON l.endpoint = c.endpoint AND l.campaign_id = c.campaign_id
        LEFT JOIN cap n ON n.endpoint = c.endpoint AND n.campaign_id = c.campaign_id
                       AND n.config_hash = l.current_config_hash""",
    "prediction_scores": """
        SELECT endpoint, campaign_id, proposer, direction, count(*) AS scored,
               avg(CASE WHEN direction_hit THEN 1.0 ELSE 0.0 END) AS hit_rate,
               avg(CASE WHEN covered THEN 1.0 ELSE 0.0 END) AS coverage,
               median(abs_log_error) AS median_abs_log_error
        FROM predictions WHERE scored GROUP BY ALL ORDER BY endpoint, campaign_id, proposer, direction""",
    "emulator_error_by_family": """
        SELECT endpoint, family, count(*) AS experiments, median(abs_log_error) AS median_abs_log_error,
               exp(avg(log_error)) - 1 AS bias, max(abs_log_error) AS worst_abs_log_error,
               min(recorded_at) AS first_at, max(recorded_at) AS last_at
        FROM (SELECT endpoint, unnest(families) AS family, log_error, abs_log_error, recorded_at FROM emulator_errors)
        GROUP BY ALL ORDER BY endpoint, family""",
    "verdict_history": """
        SELECT v.endpoint, v.decided_at, v.experiment_id, e.kind, e.candidate_hash, e.baseline_hash,
               v.stage, v.verdict, v.ratio_median, v.ci_low, v.ci_high, v.margin, v.n_baseline,
               v.n_candidate, v.reason, e.verdict AS experiment_verdict, e.confirmed
        FROM verdicts v LEFT JOIN experiments e
          ON e.experiment_id = v.experiment_id AND e.endpoint = v.endpoint
        ORDER BY v.decided_at""",
}


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict) or (isinstance(v, (list, tuple)) and any(isinstance(x, (dict, list)) for x in v)):
        return json.dumps(v, sort_keys=True, default=str)
    return list(v) if isinstance(v, tuple) else v


@dataclass
class ResultsLake:
    """The Parquet lake rooted at ``root`` plus its DuckDB view file."""
    root: Path
    _ensured: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    def duckdb_path(self) -> Path:
        return self.root / DB_NAME

    def table_dir(self, table: str) -> Path:
        return self.root / table

    def pool_dir(self, endpoint: str) -> Path:
        """Where the CLI keeps the replay pool it built from ``endpoint``'s logs (not a table: no view)."""
        return self.root / POOLS_DIR / endpoint

    def ensure(self) -> None:
        """Create (or bring up to the declared schema) the zero-row schema files, and the view database
        if missing or if a schema file changed (idempotent; checked once per instance)."""
        if self._ensured and self.duckdb_path().exists():
            return
        if self._write_schema_files() or not self.duckdb_path().exists():
            self.refresh_views()
        self._ensured = True

    def _write_schema_files(self) -> bool:
        """Write each table's zero-row schema file where missing or out of date; True if any was written."""
        changed = False
        for table, schema in TABLES.items():
            part = self.table_dir(table) / f"endpoint={SCHEMA_PARTITION}"
            target = part / "part-schema.parquet"
            # a lake written before a column was added gets the new schema file, so the view (and the
            # question views using the column) type it; older data files read it as NULL (union_by_name)
            if not target.exists() or not pq.read_schema(target).equals(schema, check_metadata=False):
                part.mkdir(parents=True, exist_ok=True)
                atomic_write(target, lambda tmp: pq.write_table(schema.empty_table(), tmp))
                changed = True
        return changed

    def append(self, table: str, rows: list[dict], *, endpoint: str) -> Path | None:
        """Append rows as one new Parquet file under endpoint=<endpoint>; returns its path (None if no rows)."""
        if not rows:
            return None
        if not endpoint or "/" in endpoint or endpoint.startswith((".", "_")):
            raise SpecError(f"results lake: invalid endpoint partition {endpoint!r}")
        if not table.replace("_", "").isalnum() or table.startswith("_"):
            raise SpecError(f"results lake: invalid table name {table!r}")
        self.ensure()
        new_table = table not in TABLES and not self.table_dir(table).exists()
        clean = [{k: _jsonable(v) for k, v in r.items() if k != "endpoint"} for r in rows]
        arrow = _to_arrow(clean, TABLES.get(table))
        part = self.table_dir(table) / f"endpoint={endpoint}"
        part.mkdir(parents=True, exist_ok=True)
        target = part / f"part-{uuid.uuid4().hex}.parquet"
        atomic_write(target, lambda tmp: pq.write_table(arrow, tmp))
        if new_table:
            self.refresh_views()  # a table outside the declared schema gets its view on first write
        return target

    def append_rows(self, rows: dict[str, list[dict]], *, endpoint: str) -> None:
        """Append a typed result's rows (table -> rows, as its ``lake_rows`` gives them), one file per table."""
        for table, table_rows in rows.items():
            self.append(table, table_rows, endpoint=endpoint)

    def view_sql(self) -> list[str]:
        found = {p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))} \
            if self.root.exists() else set()
        tables = sorted(set(TABLES) | found)
        stmts = []
        for t in tables:
            glob = (self.table_dir(t).resolve() / "*" / "*.parquet").as_posix().replace("'", "''")
            stmts.append(f"CREATE OR REPLACE VIEW {t} AS SELECT * FROM read_parquet('{glob}', "
                         "hive_partitioning=true, union_by_name=true, hive_types={'endpoint': VARCHAR})")
        stmts += [f"CREATE OR REPLACE VIEW {name} AS {sql}" for name, sql in QUESTION_VIEWS.items()]
        return stmts

    def refresh_views(self) -> None:
        """Rebuild the view database in a temp file and rename it over the old one (no reader is blocked)."""
        self._write_schema_files()

        def build(tmp: Path) -> None:
            con = duckdb.connect(str(tmp))
            try:
                for stmt in self.view_sql():
                    con.execute(stmt)
                con.execute("CHECKPOINT")
            finally:
                con.close()
            Path(f"{tmp}.wal").unlink(missing_ok=True)

        atomic_write(self.duckdb_path(), build)

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A read-only connection to the view database (retries briefly while a rename is in flight)."""
        self.ensure()
        for attempt in range(20):
            try:
                return duckdb.connect(str(self.duckdb_path()), read_only=True)
            except duckdb.IOException:
                if attempt == 19:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        con = self.connect()
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()

    def query_df(self, sql: str, params: list | None = None):
        con = self.connect()
        try:
            return con.execute(sql, params or []).df()
        finally:
            con.close()

    def read(self, table: str, *, endpoint: str | None = None) -> list[dict]:
        """All rows of a table (optionally one endpoint) as dicts, via DuckDB."""
        if table not in TABLES and not self.table_dir(table).exists():
            raise SpecError(f"results lake: unknown table {table!r}")
        where, params = ("WHERE endpoint = ?", [endpoint]) if endpoint else ("", [])
        con = self.connect()
        try:
            cur = con.execute(f"SELECT * FROM {table} {where}", params)
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]
        finally:
            con.close()


def _to_arrow(rows: list[dict], schema: pa.Schema | None) -> pa.Table:
    if schema is None:
        return pa.Table.from_pylist(rows)
    declared = [f for f in schema if any(f.name in r for r in rows)]
    extra = sorted({k for r in rows for k in r} - set(schema.names))
    fields = declared + [pa.field(k, pa.Table.from_pylist([{k: r.get(k)} for r in rows]).schema.field(k).type)
                         for k in extra]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))


def open_lake(root: str | Path) -> ResultsLake:
    lake = ResultsLake(Path(root))
    lake.ensure()
    return lake

