"""Owns the pool-build settings resource: the redaction key (a secret, via dg.EnvVar) and the tokenizer."""
import dagster as dg


class PoolSettings(dg.ConfigurableResource):
    """How replay pools are built. Without ``redaction_key`` the builder draws a random key per
    process (surrogates stay consistent within one pool, not across rebuilds)."""

    redaction_key: str | None = None
    tokenizer_path: str | None = None

    def key(self) -> bytes | None:
        return self.redaction_key.encode() if self.redaction_key else None
