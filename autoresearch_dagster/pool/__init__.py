"""Owns the replay pool: its schema (schema), its log source, fingerprint and home (sources), building it from
logs (build, chat), PII redaction (redact), workload statistics (workload) and replay fidelity (fidelity)."""
