"""Owns diagnosis: workload, load-curve, engine-metric and profile analysis, probes, and the ranked report.

Public entry points: ``diagnose`` (the report), ``parse_profile`` (Chrome traces), ``DiagnosticReport``.
"""
from autoresearch_dagster.diagnose.profile import ProfileSummary, parse_profile
from autoresearch_dagster.diagnose.report import DiagnosticReport, Finding, diagnose, top_hypotheses_text

__all__ = ["DiagnosticReport", "Finding", "ProfileSummary", "diagnose", "parse_profile", "top_hypotheses_text"]
