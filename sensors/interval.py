"""Owns how often the project's sensors tick: AUTORESEARCH_SENSOR_INTERVAL_S (read when the code loads)
replaces every sensor's default minimum interval, e.g. a few seconds for a test deployment."""
import os


def interval(default_s: int) -> int:
    raw = os.environ.get("AUTORESEARCH_SENSOR_INTERVAL_S")
    return max(1, int(raw)) if raw else default_s
