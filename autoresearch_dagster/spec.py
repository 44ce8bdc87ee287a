"""Owns the typed specs: endpoint, SLA, server config (SGLang 0.5.23 or vLLM 0.32 knob names), budgets.

One table, ``KNOBS``, is the single source of truth for every tunable server knob: its SGLang
name, type, default, allowed values or range, the research direction it belongs to, a one-line
trade-off, the values the search space (and the emulator's grid) tries, and what its values mean:
spellings of one value (``bf16`` is ``bfloat16``, ``NEXTN`` is ``EAGLE``) and a ``Meaning`` per
value (which values compute in fp8 and are therefore lossy, which speculative algorithms run a
draft model or keep mixed chunks). Validation, the drift check's equality, the emulator's inputs,
the tiny model's numerics, SGLang launch flags, the search space, the grid and the lossless/lossy
classification all derive from it, and ``server_overrides`` holds the one SGLang resolution rule
that overrides values the user set. ``VLLM_KNOBS`` is the same for vLLM's EngineArgs; an endpoint
reads the table of its engine (``knobs_for(endpoint.engine)``: vLLM's for ``engine: vllm``,
SGLang's for every other engine).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class SpecError(ValueError):
    """A spec or config that cannot be used; the message names the field and what is allowed."""


Direction = Literal["scheduling_cache", "speculative", "kernels_quant", "parallel_admission"]


@dataclass(frozen=True)
class Meaning:
    """What one knob value does beyond its name: the facts the emulator, the tiny model and the
    correctness gate read instead of matching value strings themselves."""
    fp8: Literal["e4m3", "e5m2"] | None = None  # computes in this fp8 format instead of the checkpoint's precision
    weight_scales: Literal["per_tensor", "per_channel"] | None = None  # fp8 weights (activations per token)
    draft_model: bool = False  # a speculative algorithm that runs a draft model (NGRAM looks drafts up)
    mixed_chunk: bool = True  # SGLang keeps enable_mixed_chunk under it (SpeculativeAlgorithm.supports_mixed_chunk)

    @property
    def lossy(self) -> bool:
        """Outputs may change: the value computes in a lower precision than the checkpoint's."""
        return self.fp8 is not None


_PLAIN = Meaning()


@dataclass(frozen=True)
class Knob:
    name: str  # SGLang's ServerArgs field name; the CLI flag is --name-with-dashes
    type: type
    default: Any  # None means "resolved by the server" (see resolve() in the emulator / /server_info)
    direction: Direction
    tradeoff: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None  # inclusive bounds for numeric knobs
    high: float | None = None
    nullable: bool = True
    search_values: tuple[Any, ...] = ()  # the values the offline search space and the emulator's grid try
    aliases: dict[str, Any] = field(default_factory=dict)  # spelling -> the value SGLang treats it as
    # canonical value -> its meaning; a value not listed computes like the checkpoint (lossless, no draft
    # model). May name values a server reports without our choices allowing them (auto-detected checkpoints).
    meanings: dict[Any, Meaning] = field(default_factory=dict)
    # the knob does something only for models with this trait (``ModelCard.traits``): searched only for them
    model_trait: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def canonical(self, value: Any) -> Any:
        """The value a spelling stands for (``bf16`` -> ``bfloat16``); other values unchanged."""
        return self.aliases.get(value, value) if isinstance(value, str) else value

    def meaning(self, value: Any) -> Meaning:
        return self.meanings.get(self.canonical(value), _PLAIN)

    def validate(self, value: Any) -> Any:
        if value is None:
            if self.nullable:
                return None
            raise SpecError(f"knob {self.name!r} cannot be null")
        if self.type is bool:
            if not isinstance(value, bool):
                raise SpecError(f"knob {self.name!r} must be true or false, got {value!r}")
            return value
        if self.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise SpecError(f"knob {self.name!r} must be an integer, got {value!r}")
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SpecError(f"knob {self.name!r} must be a number, got {value!r}")
            value = float(value)
        elif self.type is str:
            if not isinstance(value, str):
                raise SpecError(f"knob {self.name!r} must be a string, got {value!r}")
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(repr(c) for c in self.choices)
            raise SpecError(f"knob {self.name!r} = {value!r} is not allowed; choose one of: {allowed}")
        if self.low is not None and value < self.low:
            raise SpecError(f"knob {self.name!r} = {value!r} is below its minimum {self.low}")
        if self.high is not None and value > self.high:
            raise SpecError(f"knob {self.name!r} = {value!r} is above its maximum {self.high}")
        return value


_K = Knob
KNOBS: dict[str, Knob] = {k.name: k for k in [
    _K("chunked_prefill_size", int, None, "scheduling_cache",
       "tokens per prefill chunk: larger lowers TTFT of long prompts but stalls decode (ITL spikes); -1 disables chunking",
       low=-1, high=65536, search_values=(2048, 4096, 8192, 16384)),
    _K("max_prefill_tokens", int, 16384, "scheduling_cache",
       "token budget of one prefill batch: more requests per prefill vs longer prefill steps",
       low=1, high=262144, nullable=False),
    _K("prefill_decode_interval", int, None, "scheduling_cache",
       "decode rounds run after each prefill before the next: protects ITL/TPOT at the cost of TTFT; 0 disables",
       low=0, high=64, search_values=(0, 2, 4, 8, 16)),
    _K("prefill_decode_interval_min_bs", int, 0, "scheduling_cache",
       "apply the prefill-decode interval only while the running batch has at least this many requests",
       low=0, high=4096, nullable=False),
    _K("enable_mixed_chunk", bool, False, "scheduling_cache",
       "put running decodes into the chunked prefill batch: smoother ITL, larger prefill steps",
       nullable=False, search_values=(False, True)),
    _K("schedule_policy", str, "fcfs", "scheduling_cache",
       "queue order: lpm favours requests with long cached prefixes (more reuse, prefix-match CPU cost)",
       choices=("fcfs", "lpm"), nullable=False, search_values=("fcfs", "lpm")),
    _K("schedule_conservativeness", float, 1.0, "parallel_admission",
       "scales the admission estimate of future decode tokens: lower admits more (retraction risk)",
       low=0.0, high=10.0, nullable=False, search_values=(0.3, 0.6, 1.0, 1.5)),
    _K("max_running_requests", int, None, "parallel_admission",
       "largest decode batch: throughput vs per-token latency and KV pressure (48 by default with speculative decoding)",
       low=1, high=8192, search_values=(32, 64, 128, 256, 512)),
    _K("mem_fraction_static", float, None, "parallel_admission",
       "share of GPU memory for weights + KV pool: more KV and concurrency vs activation/graph OOM risk",
       low=0.05, high=0.99, search_values=(0.80, 0.85, 0.88, 0.92)),
    _K("mamba_full_memory_ratio", float, 0.9, "parallel_admission",
       "hybrid linear-attention models (Qwen3-Next, Qwen3.5): recurrent-state memory over full-attention KV memory: "
       "more requests in flight vs fewer KV tokens; no effect on other models",
       low=0.05, high=20.0, nullable=False, search_values=(0.5, 0.9, 2.0), model_trait="linear_attention"),
    _K("page_size", int, None, "scheduling_cache",
       "KV page size in tokens: larger pages are faster but partial pages are not reused by the prefix cache",
       low=1, high=256, search_values=(1, 16, 64)),
    _K("kv_cache_dtype", str, "auto", "kernels_quant",
       "KV cache precision: fp8 roughly doubles token capacity at some accuracy risk",
       choices=("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"), nullable=False,
       search_values=("auto", "fp8_e4m3"), aliases={"bf16": "bfloat16"},
       # auto is the checkpoint's dtype, bfloat16 for every catalog model: only the fp8 formats are lossy
       meanings={"fp8_e4m3": Meaning(fp8="e4m3"), "fp8_e5m2": Meaning(fp8="e5m2")}),
    _K("quantization", str, None, "kernels_quant",
       "weight quantization: fp8 halves weight bytes and uses fp8 tensor cores, at some accuracy risk",
       choices=("fp8", "w8a8_fp8", "unquant"), search_values=(None, "fp8"),
       # fp8: online quantization, per-tensor weight scales, dynamic per-token activations; w8a8_fp8: per
       # output channel. modelopt_fp8 and mxfp8 (block scales) are what a server reports for an fp8 checkpoint.
       meanings={"fp8": Meaning(fp8="e4m3", weight_scales="per_tensor"),
                 "w8a8_fp8": Meaning(fp8="e4m3", weight_scales="per_channel"),
                 "modelopt_fp8": Meaning(fp8="e4m3", weight_scales="per_tensor"),
                 "mxfp8": Meaning(fp8="e4m3")}),
    _K("disable_radix_cache", bool, False, "scheduling_cache",
       "turn off the radix prefix cache: no prefix reuse, less bookkeeping",
       nullable=False, search_values=(False, True)),
    _K("cuda_graph_max_bs_decode", int, None, "kernels_quant",
       "largest decode batch that runs as a CUDA graph: bigger removes launch overhead at large batch, costs memory",
       low=1, high=4096, search_values=(32, 64, 128, 256, 512)),
    _K("disable_cuda_graph", bool, False, "kernels_quant",
       "run every decode step eagerly (no CUDA graphs): saves graph memory and capture time, pays kernel launches",
       nullable=False),
    _K("disable_overlap_schedule", bool, False, "scheduling_cache",
       "turn off the overlap scheduler: CPU scheduling and output processing no longer hide behind the GPU",
       nullable=False),
    _K("tp_size", int, 1, "parallel_admission",
       "tensor parallel degree: splits weights and KV heads over GPUs vs all-reduce cost",
       choices=(1, 2, 4, 8), nullable=False, search_values=(1, 2)),
    _K("dp_size", int, 1, "parallel_admission",
       "full model replicas behind one endpoint (GPUs = dp x tp)",
       choices=(1, 2, 4, 8), nullable=False, search_values=(1, 2)),
    _K("speculative_algorithm", str, None, "speculative",
       "speculative decoding: more tokens per step at low batch, wasted draft compute near saturation",
       choices=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"), search_values=(None, "EAGLE"),
       # speculative_hook.py: NEXTN resolves to EAGLE; spec_info.py: supports_mixed_chunk is EAGLE, EAGLE3
       # (and DFLASH, DSPARK); NGRAM drafts from a trie of the context, with no draft model
       aliases={"NEXTN": "EAGLE"},
       meanings={"EAGLE": Meaning(draft_model=True), "EAGLE3": Meaning(draft_model=True),
                 "STANDALONE": Meaning(draft_model=True, mixed_chunk=False), "NGRAM": Meaning(mixed_chunk=False)}),
    _K("speculative_num_steps", int, None, "speculative",
       "draft depth: more accepted tokens per verify vs wasted draft work at high batch",
       low=1, high=16, search_values=(1, 2, 3, 5)),
    _K("speculative_eagle_topk", int, None, "speculative",
       "draft tree width", low=1, high=16, search_values=(1, 2, 4)),
    _K("speculative_num_draft_tokens", int, None, "speculative",
       "verify width (num_steps + 1 when topk is 1)", low=1, high=64, search_values=(2, 4, 8)),
    # the draft model's weights (an adapted drafter's directory: ``autoresearch drafter train`` writes its measured
    # acceptance there too, which the emulator reads in place of the per-algorithm rate); never searched
    _K("speculative_draft_model_path", str, None, "speculative",
       "the drafter: one adapted to the endpoint's traffic accepts more drafts than a stock one"),
    _K("stream_interval", int, 1, "scheduling_cache",
       "tokens per streamed chunk: less per-token overhead vs coarser client-side ITL",
       low=1, high=64, nullable=False, search_values=(1, 2, 4)),
]}


# vLLM 0.32's EngineArgs names (``vllm serve --help``; booleans are BooleanOptionalAction: --x / --no-x).
# Defaults None are resolved by vLLM for the platform (on CPU: chunked prefill and prefix caching on,
# block size 128); ``engines.vllm`` reads the resolved values back and checks them for drift.
VLLM_KNOBS: dict[str, Knob] = {k.name: k for k in [
    _K("max_num_seqs", int, None, "parallel_admission",
       "largest running batch: more concurrent decodes (throughput) vs per-token latency and KV pressure",
       low=1, high=8192, search_values=(8, 16, 32, 64, 128, 256)),
    _K("max_num_batched_tokens", int, None, "scheduling_cache",
       "token budget of one scheduler step: bigger prefill chunks lower TTFT but stall decodes (ITL spikes); "
       "without chunked prefill it must cover max_model_len",
       low=16, high=1048576, search_values=(256, 512, 1024, 2048, 4096, 8192)),
    _K("enable_chunked_prefill", bool, None, "scheduling_cache",
       "split long prefills across steps and mix them with decodes: smoother ITL, more steps per prompt",
       search_values=(True, False)),
    _K("long_prefill_token_threshold", int, 0, "scheduling_cache",
       "a prompt longer than this is a long prefill, chunked at this size so short ones pass it; 0 disables",
       low=0, high=1048576, nullable=False, search_values=(0, 256, 1024, 4096)),
    _K("enable_prefix_caching", bool, None, "scheduling_cache",
       "reuse KV blocks of shared prefixes: less prefill compute vs hashing and eviction bookkeeping",
       search_values=(True, False)),
    _K("block_size", int, None, "scheduling_cache",
       "KV block size in tokens: larger blocks are cheaper to manage but partial blocks are not prefix-cached",
       choices=(16, 32, 64, 128, 256), search_values=(32, 64, 128)),
    _K("kv_cache_dtype", str, "auto", "kernels_quant",
       "KV cache precision: fp8 doubles token capacity at some accuracy risk",
       choices=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"), nullable=False,
       aliases={"fp8": "fp8_e4m3"},
       meanings={"fp8_e4m3": Meaning(fp8="e4m3"), "fp8_e5m2": Meaning(fp8="e5m2")}),
    _K("scheduling_policy", str, "fcfs", "scheduling_cache",
       "queue order: priority serves requests by their 'priority' field (same as fcfs without one)",
       choices=("fcfs", "priority"), nullable=False),
    _K("max_model_len", int, None, "parallel_admission",
       "longest prompt + output served (requests over it are refused): more reach vs fewer concurrent sequences",
       low=16, high=1048576),
    _K("dtype", str, "auto", "kernels_quant",
       "compute dtype of weights and activations (auto: the checkpoint's)",
       choices=("auto", "bfloat16", "float16", "float32"), nullable=False,
       meanings={"float16": Meaning()}),
    _K("enforce_eager", bool, False, "kernels_quant",
       "skip torch.compile / graph capture: faster start-up, slower steps", nullable=False),
    _K("stream_interval", int, 1, "scheduling_cache",
       "tokens per streamed chunk: less per-token overhead vs coarser client-side ITL",
       low=1, high=64, nullable=False, search_values=(1, 2, 4)),
    _K("tensor_parallel_size", int, 1, "parallel_admission",
       "tensor parallel degree: splits weights over devices (on CPU: NUMA nodes) vs all-reduce cost",
       choices=(1, 2, 4, 8), nullable=False),
]}

# Which table names an endpoint's knobs: vLLM's for the vllm engine; SGLang's for every other engine
# (the emulator models an SGLang server; sglang, modal and external endpoints are SGLang's).
KNOBS_BY_ENGINE: dict[str, dict[str, Knob]] = {"sglang": KNOBS, "vllm": VLLM_KNOBS}
_TABLE_OF_ENGINE = {"vllm": "vllm"}


def knob_table(engine: str = "sglang") -> str:
    """The knob table an engine reads ('sglang' or 'vllm')."""
    return _TABLE_OF_ENGINE.get(engine, "sglang")


def knobs_for(engine: str = "sglang") -> dict[str, Knob]:
    """The knob table of an engine kind (``EndpointSpec.engine``)."""
    return KNOBS_BY_ENGINE[knob_table(engine)]


def table_of(*configs: dict[str, Any], engine: str | None = None) -> dict[str, Knob]:
    """``engine``'s knob table, or without one the table that has every knob the configs set (SGLang's first:
    the tables share a few names, with the same defaults)."""
    if engine is not None:
        return knobs_for(engine)
    keys = {k for c in configs for k in c}
    return next((t for t in KNOBS_BY_ENGINE.values() if keys <= set(t)), KNOBS)


def knob(name: str, engine: str = "sglang") -> Knob:
    table = knobs_for(engine)
    try:
        return table[name]
    except KeyError:
        which = "" if table is KNOBS else f"{knob_table(engine)} "
        raise SpecError(f"unknown {which}server knob {name!r}; known knobs: {', '.join(sorted(table))}") from None


def validate_server_config(values: dict[str, Any], engine: str = "sglang") -> dict[str, Any]:
    """Validate a server config mapping (the engine's field names, or --flag spellings); unknown knobs are errors."""
    out: dict[str, Any] = {}
    for raw_name, value in (values or {}).items():
        name = raw_name.lstrip("-").replace("-", "_")
        out[name] = knob(name, engine).validate(value)
    return out


def is_lossy(config: dict[str, Any], baseline: dict[str, Any] | None = None, engine: str = "sglang") -> bool:
    """A change is lossy when it sets a knob to a lossy value (``Meaning.lossy``) other than the baseline's.

    Going back to the checkpoint's precision is not lossy: it only removes a loss the baseline had.
    """
    baseline = baseline or {}
    for name, value in config.items():
        k = knob(name, engine)
        if k.meaning(value).lossy and k.canonical(value) != k.canonical(baseline.get(name, k.default)):
            return True
    return False


def server_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the resolution SGLang 0.5.23's ServerArgs applies whatever the hardware.

    A speculative algorithm alias becomes its algorithm (NEXTN -> EAGLE), and an algorithm that does
    not support mixed chunks turns ``enable_mixed_chunk`` off even when the user set it
    (``arg_groups/speculative_hook.py``). The emulator's and the tiny server's resolution both
    apply it, so asking for both shows up as config drift there, as on a real server.
    """
    out = dict(values)
    algo = out.get("speculative_algorithm")
    if algo is not None:
        spec = KNOBS["speculative_algorithm"]
        out["speculative_algorithm"] = spec.canonical(algo)
        if out.get("enable_mixed_chunk") and not spec.meaning(algo).mixed_chunk:
            out["enable_mixed_chunk"] = False
    return out


def launch_flags(config: dict[str, Any], engine: str = "sglang") -> list[str]:
    """The engine's command-line flags for a validated config (unset knobs are left to the server).

    SGLang's booleans are store_true flags (false = leave it out); vLLM's are BooleanOptionalAction
    and several default to a platform-resolved value, so false is spelled ``--no-<flag>``."""
    flags: list[str] = []
    table = knobs_for(engine)
    for name, value in validate_server_config(config, engine).items():
        k = table[name]
        if value is None:
            continue
        if k.type is bool:
            if value:
                flags.append(k.flag)
            elif table is VLLM_KNOBS:
                flags.append("--no-" + k.flag[2:])
            continue
        flags += [k.flag, str(value)]
    return flags


def config_hash(config: dict[str, Any]) -> str:
    """Stable short id of a config (sorted keys, unset knobs dropped)."""
    clean = {k: v for k, v in sorted(config.items()) if v is not None}
    return hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- SLA

Metric = Literal["ttft", "itl", "tpot", "e2e"]
_SLA_EXAMPLE = "e.g. 'ttft_p99<=2000ms,tpot_p99<=80ms,errors<=1%'"
_SLA_OP = re.compile(r"<=|>=|==|=<|=>|<|>|=")
_SLA_METRIC = re.compile(r"^(ttft|itl|tpot|e2e)_p(\d+(?:\.\d+)?)$")
_SLA_NUMBER = r"((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_SLA_LATENCY = re.compile(rf"^{_SLA_NUMBER}\s*(ms|s)$")
_SLA_PERCENT = re.compile(rf"^{_SLA_NUMBER}\s*%$")


class SLATerm(BaseModel):
    model_config = ConfigDict(frozen=True)
    metric: Metric
    quantile: float = Field(gt=0, lt=100, description="percentile, e.g. 99 for p99")
    max_ms: float = Field(gt=0)

    @property
    def name(self) -> str:
        q = int(self.quantile) if float(self.quantile).is_integer() else self.quantile
        return f"{self.metric}_p{q}"

    def __str__(self) -> str:
        return f"{self.name}<={self.max_ms:g}ms"


def _sla_term(part: str) -> SLATerm | float:
    """One term of an SLA string: a latency bound, or the error-rate bound as a fraction."""
    m = _SLA_OP.search(part)
    if m is None:
        raise SpecError(f"SLA term {part!r} has no bound; write it as NAME<=VALUE, {_SLA_EXAMPLE}")
    if m.group() != "<=":
        raise SpecError(f"SLA term {part!r}: only '<=' bounds are allowed, not {m.group()!r}")
    name, value = part[:m.start()].strip(), part[m.end():].strip()
    if name in ("errors", "error"):
        num = _SLA_PERCENT.match(value)
        if num is None:
            raise SpecError(f"SLA term {part!r}: the error rate needs a percentage with '%', e.g. 'errors<=1%'")
        pct = float(num.group(1))
        if pct > 100:
            raise SpecError(f"SLA term {part!r}: an error rate is between 0% and 100%")
        return pct / 100.0
    metric = _SLA_METRIC.match(name)
    if metric is None:
        raise SpecError(f"SLA term {part!r}: unknown name {name!r}; latency terms are METRIC_pQUANTILE with "
                        "METRIC one of ttft, itl, tpot, e2e (e.g. 'ttft_p99'), or 'errors'")
    q = float(metric.group(2))
    if not 0 < q < 100:
        raise SpecError(f"SLA term {part!r}: quantile p{metric.group(2)} is outside (0, 100), e.g. p50, p99, p99.9")
    num = _SLA_LATENCY.match(value)
    if num is None:
        bare = re.fullmatch(_SLA_NUMBER, value)
        hint = f"'{value}ms' or '{value}s'" if bare else "'2000ms' or '2s'"
        raise SpecError(f"SLA term {part!r}: the bound needs {'a unit' if bare else 'a number and a unit'}, "
                        f"ms or s, e.g. {hint}")
    ms = float(num.group(1)) * (1000.0 if num.group(2) == "s" else 1.0)
    if ms <= 0:
        raise SpecError(f"SLA term {part!r}: a latency bound must be positive")
    return SLATerm(metric=metric.group(1), quantile=q, max_ms=ms)


class SLA(BaseModel):
    """Latency bounds at quantiles plus a maximum error rate. Parse with ``SLA.parse``."""
    model_config = ConfigDict(frozen=True)
    terms: tuple[SLATerm, ...]
    max_error_rate: float = Field(default=0.01, ge=0, le=1)

    @model_validator(mode="after")
    def _distinct_terms(self) -> "SLA":
        names = [t.name for t in self.terms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"SLA has more than one bound for {', '.join(dupes)}; give each metric and quantile once")
        return self

    @classmethod
    def parse(cls, text: str) -> "SLA":
        """Parse 'ttft_p99<=2000ms,tpot_p99<=80ms,errors<=1%' strictly (SpecError: one line naming the term).

        Latency bounds need a unit (ms or s), the error rate a '%'; only '<=' bounds; quantiles in
        (0, 100); each metric and quantile, and the error rate, at most once. Without an error term
        the rate is 1%.
        """
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"an SLA is a comma-separated list of bounds, {_SLA_EXAMPLE}")
        terms: list[SLATerm] = []
        max_err: float | None = None
        for part in (p.strip() for p in text.split(",")):
            if not part:
                raise SpecError(f"SLA {text!r} has an empty term (a stray comma)")
            term = _sla_term(part)
            if isinstance(term, SLATerm):
                if any(t.name == term.name for t in terms):
                    raise SpecError(f"SLA {text!r} bounds {term.name} twice; give each metric and quantile once")
                terms.append(term)
            elif max_err is not None:
                raise SpecError(f"SLA {text!r} bounds the error rate twice")
            else:
                max_err = term
        if not terms:
            raise SpecError(f"an SLA needs at least one latency term, {_SLA_EXAMPLE}")
        return cls(terms=tuple(terms), max_error_rate=0.01 if max_err is None else max_err)

    def __str__(self) -> str:
        return ",".join([str(t) for t in self.terms] + [f"errors<={self.max_error_rate * 100:g}%"])


# ---------------------------------------------------------------- endpoint

EngineKind = Literal["emulator", "sglang", "vllm", "modal", "external"]
LogFormat = Literal["auto", "openai", "mooncake", "azure", "burstgpt"]


class Hardware(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: str = Field(description="GPU type from the emulator's catalog, e.g. H200")
    count: int = Field(default=1, ge=1, le=64, description="GPUs in the deployment")


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    logs: list[str] = Field(default_factory=list, description="log files or directories, relative to the spec file")
    format: LogFormat = "auto"
    mode: Literal["capacity", "shape", "both"] = "capacity"


AutoscaleMetric = Literal["running_requests", "queue_length", "in_flight", "kv_usage"]


class Autoscaling(BaseModel):
    """Replicas behind a router with a Kubernetes-HPA-like autoscaler (``emulator.autoscale``); each replica
    is one server on ``hardware.count`` GPUs. Real autoscaled endpoints: ``replicas_metric`` names the
    Prometheus gauge of serving replicas, read from ``metrics_url`` (default: the endpoint's /metrics)."""
    model_config = ConfigDict(extra="forbid")
    min_replicas: int = Field(default=1, ge=1, le=256)
    max_replicas: int = Field(ge=1, le=256)
    metric: AutoscaleMetric = Field(default="running_requests", description=(
        "per-replica metric the autoscaler targets: running_requests, queue_length (waiting), in_flight "
        "(running + waiting), kv_usage (KV-cache fraction in use, 0-1)"))
    target: float = Field(gt=0, description="target value of the metric per serving replica")
    tolerance: float = Field(default=0.1, ge=0, lt=1, description="no change while metric/target is within 1 +- this")
    decision_interval_s: float = Field(default=15.0, gt=0, description="seconds between autoscaler decisions")
    scale_up_stabilization_s: float = Field(default=0.0, ge=0, description="scale up to the lowest recommendation of this window")
    cold_start_s: float = Field(default=60.0, ge=0, description="a new replica serves only this long after the decision")
    scale_down_cooldown_s: float = Field(default=300.0, ge=0, description="scale down to the highest recommendation of this window")
    router: Literal["least_outstanding", "round_robin"] = "least_outstanding"
    replicas_metric: str | None = Field(default=None, description="Prometheus gauge of serving replicas (real endpoints)")
    desired_replicas_metric: str | None = Field(default=None, description="Prometheus gauge of the autoscaler's desired replicas")
    metrics_url: str | None = Field(default=None, description="where the replica gauges are scraped (default URL/metrics)")

    @model_validator(mode="after")
    def _check(self) -> "Autoscaling":
        if self.max_replicas < self.min_replicas:
            raise SpecError(f"max_replicas {self.max_replicas} is below min_replicas {self.min_replicas}")
        if self.metric == "kv_usage" and self.target > 1:
            raise SpecError(f"a kv_usage target is a fraction in (0, 1], got {self.target:g}")
        return self


class OperatorGuardrails(BaseModel):
    """Limits an operator sets on what a campaign may propose for this endpoint (``agents.guardrails`` applies
    them to every proposal, whoever proposed it)."""
    model_config = ConfigDict(extra="forbid")
    locked_knobs: list[str] = Field(default_factory=list, description="knobs no proposal may change")
    lossless_only: bool = Field(default=False, description="refuse every lossy change (quantization, lossy "
                                                            "speculation, ...): outputs must stay as they are")
    max_gpus: int | None = Field(default=None, ge=1, description="most GPUs a candidate may use (tp x dp), below "
                                                                 "the hardware's count (default: all of them)")


class EndpointSpec(BaseModel):
    """One served model deployment with its SLA, hardware, traffic and current server config."""
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    model: str = Field(description="model card name from the emulator catalog, a path to a Hugging Face "
                                   "config.json (or its directory; see model_is_path), or a HF model path for SGLang")
    hardware: Hardware
    sla: SLA
    server_config: dict[str, Any] = Field(default_factory=dict)
    workload: Workload = Field(default_factory=Workload)
    engine: EngineKind = "emulator"
    url: str | None = Field(default=None, description="base URL of an existing endpoint (engine: external)")
    engine_options: dict[str, Any] = Field(default_factory=dict, description="engine-specific settings")
    autoscaling: Autoscaling | None = Field(default=None, description="replicas behind a router with an autoscaler")
    guardrails: OperatorGuardrails = Field(default_factory=OperatorGuardrails)
    source_path: str | None = Field(default=None, exclude=True)

    @field_validator("sla", mode="before")
    @classmethod
    def _parse_sla(cls, v: Any) -> Any:
        return SLA.parse(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check_engine(self) -> "EndpointSpec":
        if self.engine == "external" and not self.url:
            raise SpecError(f"endpoint {self.name!r}: engine 'external' needs a url")
        try:  # the engine's own knob table (engine is known only once every field is read)
            self.server_config = validate_server_config(self.server_config, self.engine)
        except SpecError as e:
            raise SpecError(f"server_config: {e}") from None
        try:  # locked knobs by the engine's field names (a --flag spelling is accepted, as in server_config)
            self.guardrails.locked_knobs = sorted({knob(k.lstrip("-").replace("-", "_"), self.engine).name
                                                   for k in self.guardrails.locked_knobs})
        except SpecError as e:
            raise SpecError(f"guardrails.locked_knobs: {e}") from None
        return self

    @property
    def knobs(self) -> dict[str, Knob]:
        """The knob table of this endpoint's engine."""
        return knobs_for(self.engine)

    @property
    def gpus(self) -> int:
        return self.hardware.count

    @property
    def max_candidate_gpus(self) -> int:
        """The most GPUs a candidate config may use: the hardware's, or fewer where the operator says so."""
        return min(self.gpus, self.guardrails.max_gpus or self.gpus)

    def log_paths(self) -> list[Path]:
        base = Path(self.source_path).parent if self.source_path else Path.cwd()
        return [(base / p).resolve() for p in self.workload.logs]


def read_spec_file(path: str | Path, what: str) -> Any:
    """A YAML/JSON file's content; SpecError (one line naming the file) when it is missing, not a file,
    unreadable or not valid YAML."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{what} {path} does not exist")
    if not path.is_file():
        raise SpecError(f"{what} {path} is {'a directory' if path.is_dir() else 'not a regular file'}, not a file")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecError(f"{what} {path} cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{what} {path} is not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SpecError(f"{what} {path} is not valid YAML: {getattr(e, 'problem', None) or e}{where}") from None


def validation_message(e: ValidationError) -> str:
    """A pydantic error as one line: 'field.path: message; ...'."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def model_is_path(model: str) -> bool:
    """Whether an endpoint's ``model`` names a config.json (or a directory holding one) rather than a catalog
    model: it ends in ``.json`` or starts with ``./``, ``../``, ``/`` or ``~``."""
    return model.endswith(".json") or model.startswith(("./", "../", "/", "~"))


def load_endpoint(path: str | Path) -> EndpointSpec:
    """Read an endpoint spec from YAML or JSON; errors name the file and the field (one line). An emulated
    model given as a relative config path is made absolute against the spec file's directory."""
    path = Path(path)
    data = read_spec_file(path, "endpoint spec")
    if not isinstance(data, dict):
        raise SpecError(f"endpoint spec {path} must be a mapping")
    try:
        spec = EndpointSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"endpoint spec {path}: {validation_message(e)}") from None
    except SpecError as e:
        raise SpecError(f"endpoint spec {path}: {e}") from None
    update: dict[str, Any] = {"source_path": str(path.resolve())}
    if spec.engine == "emulator" and model_is_path(spec.model):
        update["model"] = str((path.resolve().parent / Path(spec.model).expanduser()).resolve())
    return spec.model_copy(update=update)


def load_server_config(path: str | Path) -> dict[str, Any]:
    """Read a candidate server config file (YAML/JSON mapping of knob → value, or {server_config: {...}})."""
    path = Path(path)
    data = read_spec_file(path, "config file") or {}
    if isinstance(data, dict) and "server_config" in data:
        data = data["server_config"]
    if not isinstance(data, dict):
        raise SpecError(f"config file {path} must be a mapping of knob names to values")
    try:
        return validate_server_config(data)
    except SpecError as e:
        raise SpecError(f"config file {path}: {e}") from None


def discover_endpoints(directory: str | Path) -> list[EndpointSpec]:
    """All endpoint specs (*.yaml, *.yml, *.json) in a directory, sorted by name."""
    specs = [load_endpoint(p) for p in sorted(Path(directory).glob("*.y*ml")) + sorted(Path(directory).glob("*.json"))]
    names = [s.name for s in specs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise SpecError(f"duplicate endpoint names in {directory}: {sorted(dupes)}")
    return sorted(specs, key=lambda s: s.name)


@dataclass
class Budget:
    """Limits for a campaign or one experiment."""
    max_runs_per_arm: int = 20
    initial_runs_per_arm: int = 5
    max_wall_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class CampaignBudget(BaseModel):
    """What one campaign may spend; reaching a limit ends it cleanly with its state saved.

    GPU-hours count the time deployments held their GPUs: virtual time on the emulator counts as GPU
    time. ``max_concurrent_gpus`` bounds the deployments measured at once (runs of the emulator go to
    that many local worker processes; Dagster's ``gpu`` concurrency pool bounds experiment steps)."""
    model_config = ConfigDict(extra="forbid")
    max_experiments: int | None = Field(default=20, ge=1)
    max_gpu_hours: float | None = Field(default=None, gt=0)
    max_wall_s: float | None = Field(default=None, gt=0, description="deadline, seconds after the campaign started")
    max_concurrent_gpus: int = Field(default=1, ge=1, le=64)
