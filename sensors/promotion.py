"""Owns the promotion sensor: the loop's back edge from promotion_decision to confirmed_baseline."""

import dagster as dg

from assets.config import PROMOTED_FROM_TAG, BaselineConfig
from sensors.interval import interval

DECISION = dg.AssetKey("promotion_decision")
BASELINE = dg.AssetKey("confirmed_baseline")


def _already_promoted(instance: dg.DagsterInstance, partition: str, source_run: str) -> bool:
    """True when a baseline run of this partition already names ``source_run`` (a reset cursor must
    not promote twice; run_key only deduplicates runs the daemon launched)."""
    runs = instance.get_run_records(dg.RunsFilter(tags={PROMOTED_FROM_TAG: source_run,
                                                        "dagster/partition": partition}), limit=1)
    return bool(runs)


@dg.sensor(target=[BASELINE], minimum_interval_seconds=interval(30), default_status=dg.DefaultSensorStatus.RUNNING)
def promotion_sensor(context: dg.SensorEvaluationContext):
    """Turn each positive promotion_decision into a run that re-materializes confirmed_baseline with
    the candidate's config. Reads every decision since the cursor (an @asset_sensor would see only
    the latest one per tick and drop endpoints promoted between ticks)."""
    after = int(context.cursor) if context.cursor else None
    res = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=DECISION, after_storage_id=after), limit=100, ascending=True)
    requests = []
    for rec in res.records:
        mat = rec.asset_materialization
        md = mat.metadata
        promote = md.get("promote")
        if not (promote and promote.value) or mat.partition is None:
            continue
        source = rec.run_id or f"runless-{rec.storage_id}"  # decisions reported outside a run have no run id
        if _already_promoted(context.instance, mat.partition, source):
            continue
        candidate = md["candidate_id"].value
        requests.append(dg.RunRequest(
            run_key=f"promote:{mat.partition}:{candidate}:{rec.storage_id}",
            partition_key=mat.partition,
            asset_selection=[BASELINE],
            run_config=dg.RunConfig(ops={"confirmed_baseline": BaselineConfig(
                candidate_id=candidate, server_config_json=md["server_config_json"].value,
                experiment_id=md["experiment_id"].value if "experiment_id" in md else "")}),
            tags={PROMOTED_FROM_TAG: source, "autoresearch/endpoint": mat.partition}))
    cursor = str(res.records[-1].storage_id) if res.records else context.cursor
    return dg.SensorResult(run_requests=requests, cursor=cursor)
