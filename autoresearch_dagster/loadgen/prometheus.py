"""Owns reading Prometheus text: the one parser of /metrics (SGLang's names; vLLM's read as them too) and its
per-scrape reading.

The HTTP runner's in-step scrapes and diagnosis's bracketing scrapes both go through ``snapshot``,
so one engine time series never mixes two readings of the same metric. ``snapshot``'s rule per
metric kind: ratio gauges (``RATIO_GAUGES``) averaged over label sets, everything else summed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

PREFIX = "sglang:"
# Gauges that are per-rank ratios (reference/sglang-0.5.23.md §2.5): a server with several schedulers
# (DP ranks, or --enable-metrics-for-all-schedulers) exposes one label set per rank, and their mean is
# the server's reading (two ranks at 60 % KV usage are 60 % full, not 120 %). Every other sample
# (counters, queue and running-request gauges, gen_throughput in tokens/s, histogram _sum/_count)
# adds up over ranks and is summed, as the emulator does over its replicas.
RATIO_GAUGES = frozenset({"token_usage", "full_token_usage", "swa_token_usage", "mamba_usage", "cache_hit_rate",
                          "spec_accept_length", "spec_accept_rate", "utilization", "new_token_ratio",
                          "fwd_occupancy"})

# vLLM 0.32's V1 metrics that mean what an SGLang metric means (checked against the CPU build's /metrics): the
# snapshot carries them under the SGLang name too, so the runner's time series and the diagnosis read a vLLM
# endpoint with one vocabulary. Prefix-cache hits are tokens served from the cache, as SGLang's cached tokens.
VLLM_ALIASES = {"vllm:num_requests_running": "num_running_reqs", "vllm:num_requests_waiting": "num_queue_reqs",
                "vllm:kv_cache_usage_perc": "token_usage", "vllm:prefix_cache_hits_total": "cached_tokens_total",
                "vllm:prompt_tokens_total": "prompt_tokens_total",
                "vllm:generation_tokens_total": "generation_tokens_total",
                "vllm:num_preemptions_total": "num_retracted_reqs_total"}
VLLM_RATIO_GAUGES = frozenset({"vllm:kv_cache_usage_perc"})

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


class MetricsError(ValueError):
    """Unparseable metrics text; the message names the line."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _unescape(v: str) -> str:
    return v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (0.0.4); comments and blank lines are skipped."""
    out: list[Sample] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise MetricsError(f"metrics line {lineno} is not a Prometheus sample: {raw[:120]!r}")
        labels: list[tuple[str, str]] = []
        if m.group("labels"):
            body = m.group("labels").strip()
            pos = 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                if not lm:
                    raise MetricsError(f"metrics line {lineno} has malformed labels: {raw[:120]!r}")
                labels.append((lm.group(1), _unescape(lm.group(2))))
                pos = lm.end()
        v = m.group("value")
        try:
            value = float({"+Inf": "inf", "-Inf": "-inf", "NaN": "nan"}.get(v, v))
        except ValueError:
            raise MetricsError(f"metrics line {lineno} has a non-numeric value {v!r}") from None
        out.append(Sample(m.group("name"), tuple(sorted(labels)), value))
    return out


def snapshot(text: str) -> dict[str, float]:
    """One flat reading per metric name: counters/gauges summed over label sets (ratios averaged),
    histograms as ``name_sum``/``name_count``, plus ``name{label=value}`` for labelled counters."""
    acc: dict[str, list[float]] = {}
    for s in parse_prometheus(text):
        if s.name.endswith("_bucket"):
            continue
        acc.setdefault(s.name, []).append(s.value)
        extra = [(k, v) for k, v in s.labels if k in ("cache_source", "mode", "category", "stage")]
        if extra:
            key = s.name + "{" + ",".join(f'{k}="{v}"' for k, v in extra) + "}"
            acc.setdefault(key, []).append(s.value)
    out: dict[str, float] = {}
    for name, vals in acc.items():
        base = name.split("{")[0].removeprefix(PREFIX)
        out[name] = float(np.mean(vals)) if base in RATIO_GAUGES or name in VLLM_RATIO_GAUGES else float(np.sum(vals))
    for vllm_name, sglang_name in VLLM_ALIASES.items():  # a vLLM server read under SGLang's names as well
        if vllm_name in out and PREFIX + sglang_name not in out:
            out[PREFIX + sglang_name] = out[vllm_name]
    return out
