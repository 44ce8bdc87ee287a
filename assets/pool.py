"""Owns the replay_pool asset and its blocking replay_fidelity check (thin: the core builds and checks)."""

import json
from pathlib import Path

import dagster as dg

from assets.metadata import parquet_schema
from assets.partitions import endpoints
from autoresearch_dagster.outputs.files import json_safe
from resources import EndpointRegistry, PoolSettings, ResultsLakeResource


@dg.asset(
    partitions_def=endpoints,
    group_name="pool",
    kinds={"parquet", "pyarrow"},
    tags={"autoresearch/stage": "pool"},
)
def replay_pool(context: dg.AssetExecutionContext, registry: EndpointRegistry, lake: ResultsLakeResource,
                pool_settings: PoolSettings) -> dg.MaterializeResult:
    """Redacted replay pool built from the endpoint's production logs: one Parquet row per request
    (arrival offset, messages/tools as JSON, sampling, token counts, prefix block hashes, split).
    Bad records are quarantined with a reason; fidelity statistics go to fidelity.json. Kept in the
    lake's pool home, shared with the CLI, and reused while the logs are unchanged."""
    from autoresearch_dagster.pool.sources import ensure_pool

    name = context.partition_key
    spec = registry.load(name)
    logs = registry.log_files(name)
    if not logs:
        raise dg.Failure(f"endpoint {name!r} lists no log files (workload.logs in its spec)")
    built = ensure_pool(logs, name, lake.lake().pool_dir(name), fmt=spec.workload.format, key=pool_settings.key(),
                        tokenizer_path=pool_settings.tokenizer_path, say=context.log.info)
    pool, summary = built.pool, built.summary
    context.log.info(f"pool {pool.path}: {summary.get('rows_accepted')} accepted, "
                     f"{summary.get('rows_quarantined')} quarantined")
    return dg.MaterializeResult(
        data_version=dg.DataVersion(pool.content_hash),
        metadata={
            "dagster/row_count": len(pool),
            "dagster/column_schema": parquet_schema(Path(pool.path)),
            "path": dg.MetadataValue.path(str(pool.path)),
            "quarantine": dg.MetadataValue.path(str(built.home / "quarantine.jsonl")),
            "rows_in": int(summary.get("rows_in", 0)),
            "rows_quarantined": int(summary.get("rows_quarantined", 0)),
            "redactions": dg.MetadataValue.json(json_safe(summary.get("redactions", {}))),
            "content_hash": pool.content_hash,
            "logs": dg.MetadataValue.json([str(p) for p in logs]),
        },
    )


@dg.asset_check(asset=replay_pool, blocking=True, partitions_def=endpoints,
                description="The pool matches its source logs: token-length distributions, prefix "
                            "reuse, arrival process and concurrency within the fidelity thresholds.")
def replay_fidelity(context: dg.AssetCheckExecutionContext, lake: ResultsLakeResource) -> dg.AssetCheckResult:
    name = context.partition_key
    path = lake.lake().pool_dir(name) / "fidelity.json"
    if not path.exists():
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR,
                                   description=f"{path} is missing: the pool build wrote no fidelity report")
    fidelity = json.loads(path.read_text())
    checks = fidelity.get("checks", {})
    failed = {k: c for k, c in checks.items() if not c.get("passed")}
    description = ("all fidelity statistics within thresholds" if not failed else
                   "failed: " + "; ".join(f"{k} = {c.get('value')} (threshold {c.get('threshold')})"
                                          for k, c in failed.items()))
    metadata: dict[str, dg.RawMetadataValue] = {
        "checks": dg.MetadataValue.json(json_safe(checks)),
        "n_failed": len(failed),
        "report": dg.MetadataValue.path(str(path)),
    }
    for k, c in checks.items():
        if isinstance(c.get("value"), (int, float)) and not isinstance(c.get("value"), bool):
            metadata[k] = float(c["value"])
    return dg.AssetCheckResult(passed=bool(fidelity.get("passed")) and not failed,
                               severity=dg.AssetCheckSeverity.ERROR,
                               description=description, metadata=metadata)
