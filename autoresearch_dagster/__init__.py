"""autoresearch-dagster: a self-improving research loop for LLM inference endpoints."""
__version__ = "0.1.0"
