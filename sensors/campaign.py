"""Owns the campaign sensor: the back edge from a closed round to the next one, or to the report.

Between promotions the baseline does not change, so another round (proposals -> experiments ->
decision) runs without re-measuring noise or re-diagnosing; when the campaign ends (deadline, budget,
no evidence-supported experiment left) its report and review package are materialized. A promotion
is the promotion sensor's edge, not this one. Reads every decision since its cursor.
"""
import dagster as dg

from sensors.interval import interval

DECISION = dg.AssetKey("promotion_decision")
ROUND = [dg.AssetKey("proposals"), dg.AssetKey("experiment_results"), DECISION]
REPORT = dg.AssetKey("campaign_report")


@dg.sensor(target=[*ROUND, REPORT], minimum_interval_seconds=interval(30), default_status=dg.DefaultSensorStatus.RUNNING)
def campaign_sensor(context: dg.SensorEvaluationContext):
    """Request the next round for a decision that continues the campaign, the report for one that ends it."""
    after = int(context.cursor) if context.cursor else None
    res = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=DECISION, after_storage_id=after), limit=100, ascending=True)
    requests = []
    for rec in res.records:
        mat = rec.asset_materialization
        md, part = mat.metadata, mat.partition
        if part is None or "next" not in md:
            continue
        nxt, promote = md["next"].value, bool(md["promote"].value)
        if nxt == "continue" and not promote:
            requests.append(dg.RunRequest(run_key=f"round:{part}:{rec.storage_id}", partition_key=part,
                                          asset_selection=ROUND, tags={"autoresearch/endpoint": part,
                                                                       "autoresearch/next": "round"}))
        elif nxt == "end":
            requests.append(dg.RunRequest(run_key=f"report:{part}:{rec.storage_id}", partition_key=part,
                                          asset_selection=[REPORT], tags={"autoresearch/endpoint": part,
                                                                          "autoresearch/next": "report"}))
    cursor = str(res.records[-1].storage_id) if res.records else context.cursor
    return dg.SensorResult(run_requests=requests, cursor=cursor)
