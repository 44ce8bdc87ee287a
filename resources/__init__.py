"""Dagster resources wrapping the domain core: endpoint specs, engines, results lake, artifact store."""
from resources.campaign import CampaignResource
from resources.endpoints import EndpointRegistry
from resources.engines import EngineFactory, MeasurementSettings
from resources.pool import PoolSettings
from resources.storage import ArtifactStore, MemoryStore, ResultsLakeResource

__all__ = [
    "ArtifactStore",
    "CampaignResource",
    "EndpointRegistry",
    "EngineFactory",
    "MeasurementSettings",
    "MemoryStore",
    "PoolSettings",
    "ResultsLakeResource",
]
