"""Owns campaigns: one endpoint's research under a fixed pool, SLA and correctness requirements.

A campaign is reused from the lake while its pool, SLA and correctness hashes (and, where the caller
names one, the engine version it started on) match; changing any of them starts a new one whose
original baseline is recorded as the campaign's reference.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import EndpointSpec, config_hash, is_lossy


def _hash_obj(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Campaign:
    """One endpoint's research under a fixed pool, SLA and correctness requirements."""
    campaign_id: str
    endpoint: str
    pool_hash: str
    sla: str
    sla_hash: str
    correctness_hash: str
    original_config: dict[str, Any]
    original_config_hash: str
    engine: str
    gpus: int
    engine_version: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def lake_rows(self, endpoint: EndpointSpec) -> dict[str, list[dict]]:
        """A new campaign's rows: its endpoint, itself, its original config and that config as first baseline."""
        now = utc_now()
        return {"endpoints": [{"name": endpoint.name, "model": endpoint.model, "gpu": endpoint.hardware.gpu,
                               "gpus": endpoint.gpus, "sla": str(endpoint.sla), "engine": endpoint.engine,
                               "spec_json": endpoint.model_dump(mode="json"), "recorded_at": now}],
                "campaigns": [{**{k: v for k, v in self.to_dict().items() if k not in ("endpoint", "original_config")},
                               "original_config_json": json.dumps(self.original_config, sort_keys=True),
                               "created_at": now}],
                **config_rows(self.original_config, source="original"),
                **self.baseline_rows(self.original_config, reason="original", experiment_id=None)}

    def baseline_rows(self, config: dict[str, Any], *, reason: str, experiment_id: str | None,
                      capacity_rps_per_gpu: float | None = None) -> dict[str, list[dict]]:
        """The row of one working baseline of this campaign (the original, or a promotion)."""
        return {"baselines": [{"campaign_id": self.campaign_id, "config_hash": config_hash(config),
                               "config_json": json.dumps(config, sort_keys=True), "reason": reason,
                               "source_experiment_id": experiment_id,
                               "capacity_rps_per_gpu": capacity_rps_per_gpu, "recorded_at": utc_now()}]}


def config_rows(config: dict[str, Any], *, source: str, baseline: dict[str, Any] | None = None,
                engine: str = "sglang") -> dict[str, list[dict]]:
    """The row of one config seen (lossy against ``baseline`` when one is given; ``engine``'s knobs)."""
    return {"configs": [{"config_hash": config_hash(config), "config_json": json.dumps(config, sort_keys=True),
                         "lossy": is_lossy(config, baseline, engine) if baseline is not None else None,
                         "source": source, "recorded_at": utc_now()}]}


def identity(endpoint: EndpointSpec, pool: Any, correctness: dict[str, Any] | None = None) -> tuple[str, str, str]:
    """What a campaign holds fixed besides the engine version: (pool content hash, SLA, correctness hash)."""
    return str(pool.content_hash), str(endpoint.sla), _hash_obj(correctness or {})


def campaign_id(endpoint: EndpointSpec, pool: Any, *, correctness: dict[str, Any] | None = None,
                engine_version: str | None = None) -> str:
    """The campaign's id: its endpoint, pool, SLA and correctness requirements, and the engine version it
    started on when one is named (an engine upgrade after a campaign ended starts another)."""
    parts = [endpoint.name, str(pool.content_hash), _hash_obj(str(endpoint.sla)), _hash_obj(correctness or {})]
    return f"c-{_hash_obj(parts if engine_version is None else [*parts, str(engine_version)])}"


def start_campaign(endpoint: EndpointSpec, pool: Any, *, results: Any = None, engine_name: str | None = None,
                   correctness: dict[str, Any] | None = None, baseline_config: dict[str, Any] | None = None,
                   engine_version: str | None = None) -> Campaign:
    """The campaign for (endpoint, pool, SLA, correctness requirements[, engine version]): reused from the
    lake when the hashes match, else a new one whose original baseline (the campaign reference) is recorded."""
    pool_hash = str(pool.content_hash)
    sla_hash = _hash_obj(str(endpoint.sla))
    corr_hash = _hash_obj(correctness or {})
    cid = campaign_id(endpoint, pool, correctness=correctness, engine_version=engine_version)
    if results is not None:
        for row in results.read("campaigns", endpoint=endpoint.name):
            if (row.get("pool_hash"), row.get("sla_hash"), row.get("correctness_hash")) == (pool_hash, sla_hash,
                                                                                            corr_hash) \
                    and (engine_version is None or row.get("campaign_id") == cid):
                return Campaign(campaign_id=row["campaign_id"], endpoint=endpoint.name, pool_hash=pool_hash,
                                sla=str(endpoint.sla), sla_hash=sla_hash, correctness_hash=corr_hash,
                                original_config=json.loads(row["original_config_json"] or "{}"),
                                original_config_hash=row["original_config_hash"], engine=row.get("engine")
                                or endpoint.engine, gpus=int(row.get("gpus") or endpoint.gpus),
                                engine_version=row.get("engine_version") or engine_version)
    config = dict(endpoint.server_config if baseline_config is None else baseline_config)
    camp = Campaign(campaign_id=cid, endpoint=endpoint.name, pool_hash=pool_hash, sla=str(endpoint.sla),
                    sla_hash=sla_hash, correctness_hash=corr_hash, original_config=config,
                    original_config_hash=config_hash(config), engine=engine_name or endpoint.engine, gpus=endpoint.gpus,
                    engine_version=engine_version)
    if results is not None:
        results.append_rows(camp.lake_rows(endpoint), endpoint=endpoint.name)
    return camp


def record_promotion(results: Any, campaign: Campaign, config: dict[str, Any], *, experiment_id: str | None,
                     capacity_rps_per_gpu: float | None = None) -> None:
    """A confirmed "better" became the working baseline (the campaign's original stays the reference)."""
    results.append_rows(campaign.baseline_rows(config, reason="promotion", experiment_id=experiment_id,
                                               capacity_rps_per_gpu=capacity_rps_per_gpu),
                        endpoint=campaign.endpoint)
