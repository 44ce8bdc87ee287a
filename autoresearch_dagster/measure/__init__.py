"""Owns measurement through the runner: the one load step and its statistics (step), the capacity search
(capacity), the production-shape replay (shape) and the named measurement profiles (profiles)."""
