"""Owns the measurement outputs, one module per medium."""
