"""Owns the replay_pool asset and its blocking replay_fidelity check (thin: the core builds and checks)."""

import json
from pathlib import Path

import dagster as dg

from assets.metadata import json_safe, parquet_schema
from assets.partitions import endpoints
from resources import ArtifactStore, EndpointRegistry, PoolSettings


@dg.asset(
    partitions_def=endpoints,
    group_name="pool",
    kinds={"parquet", "pyarrow"},
    tags={"autoresearch/stage": "pool"},
)
def replay_pool(context: dg.AssetExecutionContext, registry: EndpointRegistry, store: ArtifactStore,
                pool_settings: PoolSettings) -> dg.MaterializeResult:
    """Redacted replay pool built from the endpoint's production logs: one Parquet row per request
    (arrival offset, messages/tools as JSON, sampling, token counts, prefix block hashes, split).
    Bad records are quarantined with a reason; fidelity statistics go to fidelity.json."""
    from autoresearch_dagster.pool.schema import read_pool
    from autoresearch_dagster.pool.build import build_pool

    name = context.partition_key
    spec = registry.load(name)
    logs = registry.log_files(name)
    if not logs:
        raise dg.Failure(f"endpoint {name!r} lists no log files (workload.logs in its spec)")
    result = build_pool(logs, name, store.dir(name, "replay_pool"), fmt=spec.workload.format,
                        key=pool_settings.key(), tokenizer_path=pool_settings.tokenizer_path)
    pool = read_pool(result.pool_path)
    summary = result.summary
    context.log.info(f"pool {result.pool_path}: {summary.get('rows_accepted')} accepted, "
                     f"{summary.get('rows_quarantined')} quarantined")
    return dg.MaterializeResult(
        data_version=dg.DataVersion(pool.content_hash),
        metadata={
            "dagster/row_count": len(pool),
            "dagster/column_schema": parquet_schema(Path(result.pool_path)),
            "path": dg.MetadataValue.path(str(result.pool_path)),
            "quarantine": dg.MetadataValue.path(str(result.quarantine_path)),
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
def replay_fidelity(context: dg.AssetCheckExecutionContext, store: ArtifactStore) -> dg.AssetCheckResult:
    name = context.partition_key
    path = store.dir(name, "replay_pool") / "fidelity.json"
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
