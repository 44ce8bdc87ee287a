"""Owns the human approval of a campaign's result: a recorded decision on its review package."""
import dagster as dg

from assets.loop import campaign_report
from assets.partitions import endpoints
from resources import ArtifactStore, ResultsLakeResource


class ApprovalConfig(dg.Config):
    """Who decided, what, and why (launch the ``approve_production`` job with this config)."""

    who: str
    decision: str  # approve | reject | request_changes
    note: str = ""


@dg.asset(partitions_def=endpoints, group_name="review", kinds={"json"}, deps=[campaign_report])
def production_approval(context: dg.AssetExecutionContext, config: ApprovalConfig, store: ArtifactStore,
                        lake: ResultsLakeResource) -> dg.MaterializeResult:
    """A person's decision on the campaign's review package (config diff, SGLang launch command, gain with
    its CI, lossless/lossy, correctness, evidence, open questions). Production changes are never made by
    the product: this records the decision (review/approvals.jsonl and the lake's approvals table) and, for an
    approval of the latest best config, writes the deploy artifact (review/deploy/); a stale package fails."""
    from autoresearch_dagster.campaign.review import record_approval
    from autoresearch_dagster.spec import SpecError

    review = store.dir(context.partition_key, "campaign") / "review"
    try:
        row = record_approval(review, who=config.who, decision=config.decision, note=config.note,
                              results=lake.lake(), run_id=context.run.run_id)
    except SpecError as e:
        raise dg.Failure(str(e)) from None
    return dg.MaterializeResult(metadata={
        "decision": row["decision"], "who": row["who"], "note": row["note"], "config_hash": row["config_hash"],
        "campaign_id": row["campaign_id"], "approval_id": row["approval_id"], "package_hash": row["package_hash"],
        "review": dg.MetadataValue.path(str(review)),
        **({"deploy": dg.MetadataValue.path(row["deploy_path"])} if row["deploy_path"] else {})})


approve_production = dg.define_asset_job("approve_production", selection=[production_approval],
                                         description="Record a human decision on an endpoint's campaign result "
                                                     "(config: who, decision approve | reject | request_changes, note)")
