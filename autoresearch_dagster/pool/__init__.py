"""Owns the replay pool: its schema (schema), building it from logs (build, chat), PII redaction (redact),
workload statistics (workload) and replay fidelity (fidelity)."""
