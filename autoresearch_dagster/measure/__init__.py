"""Owns measurement through the runner: load-step statistics, the capacity search and the production-shape replay."""
