"""Fixtures for diagnosis tests (the builders live in helpers so tests can import them)."""
from .helpers import sglang_trace_dir  # noqa: F401  (re-exported as a fixture)
