"""Owns the emulator server's Prometheus text exposition: SGLang's metric names, labels and default buckets.

Request-level histograms and counters are recorded by the server (SGLang's tokenizer-manager
metrics, labels ``model_name, engine_type``); scheduler gauges come from ``EngineCore.metrics()``
(labels ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank``). Format: Prometheus text
exposition 0.0.4, as ``prometheus_client`` writes it.
"""
from __future__ import annotations

import bisect
import math

# SGLang 0.5.23 defaults (observability/metrics_collector.py, TokenizerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
TPOT_BUCKETS = (0.002, 0.005, 0.010, 0.020, 0.030, 0.040, 0.050, 0.060, 0.080, 0.100, 0.150, 0.200, 0.300,
                0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)

_HELP = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:num_used_tokens": "The number of used tokens.",
    "sglang:token_usage": "The token usage.",
    "sglang:gen_throughput": "The generation throughput (token/s).",
    "sglang:cache_hit_rate": "The prefix cache hit rate.",
    "sglang:max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "sglang:spec_accept_length": "The average acceptance length of speculative decoding.",
    "sglang:num_retracted_requests_total": "Total number of retracted requests.",
    "sglang:prompt_tokens_total": "Number of prefill tokens processed.",
    "sglang:generation_tokens_total": "Number of generation tokens processed.",
    "sglang:cached_tokens_total": "Number of cached prompt tokens.",
    "sglang:num_requests_total": "Number of requests processed.",
    "sglang:num_aborted_requests_total": "Number of requests aborted.",
    "sglang:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "sglang:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "sglang:e2e_request_latency_seconds": "Histogram of End-to-end request latency in seconds",
    "sglang:request_time_per_output_token_seconds": "Histogram of time per output token in seconds.",
    "sglang:http_requests_total": "Total number of HTTP requests received.",
    "sglang:http_requests_active": "Number of HTTP requests being served.",
}


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, esc)) + "}"


class Histogram:
    """Cumulative-bucket histogram (one label set)."""

    def __init__(self, name: str, buckets: tuple[float, ...]):
        self.name = name
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # last slot: above the largest bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times

    def render(self, labels: dict[str, str]) -> list[str]:
        out = [f"# HELP {self.name} {_HELP.get(self.name, self.name)}", f"# TYPE {self.name} histogram"]
        cum = 0
        for bound, c in zip(self.buckets + (math.inf,), self.counts):
            cum += c
            out.append(f"{self.name}_bucket{_labels({**labels, 'le': _fmt(bound)})} {_fmt(cum)}")
        out.append(f"{self.name}_sum{_labels(labels)} {_fmt(self.sum)}")
        out.append(f"{self.name}_count{_labels(labels)} {_fmt(self.count)}")
        return out


def render_scalar(name: str, value: float, labels: dict[str, str], kind: str | None = None) -> list[str]:
    kind = kind or ("counter" if name.endswith("_total") else "gauge")
    return [f"# HELP {name} {_HELP.get(name, name)}", f"# TYPE {name} {kind}",
            f"{name}{_labels(labels)} {_fmt(value)}"]


def exposition(families: list[list[str]]) -> str:
    return "\n".join(line for fam in families for line in fam) + "\n"
