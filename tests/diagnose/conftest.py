"""Fixtures for diagnosis tests (the builders live in diag_helpers so tests can import them)."""
from diag_helpers import sglang_trace_dir  # noqa: F401  (re-exported as a fixture)
