"""Owns experiments: campaigns, runs, the noise floor, baseline-vs-candidate verdicts, ablations, promotion."""
