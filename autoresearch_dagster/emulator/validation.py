"""Owns the emulator's validation against published real-GPU serving measurements: the table's schema and
split rule, the workloads each point describes, the emulator's prediction of each point, the error
statistics, the fit of ``Efficiency`` factors on the table's ``fit`` half, and the calibration transfer (calibrate on
one published run of an endpoint, predict its others: ``transfer``).

The table (``benchmarks/data/emulator_validation.json``) lists points read in public sources (URL, engine,
version, GPU, TP, weights and KV dtype, workload, metric, value, the source's own lines). Each point is
replayed in virtual time on the point's model, GPU and server config with the emulator's SGLang defaults:

- ``concurrency`` workloads keep C requests in flight (``vllm bench serve --max-concurrency C``);
- ``offline`` workloads send every prompt at t=0 (request rate inf);
- ``rate`` workloads send at a fixed Poisson rate.

ShareGPT prompts are not available offline, so a ShareGPT run is replayed with lognormal lengths clipped
the way ``vllm bench serve`` filters the dataset (prompt 4..1024 tokens, prompt + output <= 2048) and
scaled so the totals equal the ones the source printed; ``random`` runs use the stated fixed lengths.

The split of the first 80 points is fixed by the id alone (``split_of``), before any error was looked at;
factors are fitted on the ``fit`` points only (``fit``), and the ``report`` half is what the benchmark
reported. Points added later carry an ``added`` date and a declared split: ``holdout`` for sources nobody had
read while the emulator was being changed (never fitted; the benchmark's first print of them is the clean
out-of-sample figure), ``fit`` for sources read during that work. Holdout points come in rounds (``round``): once a
round has been printed it has been seen, and the next model change is judged on a new round. The ``report`` half
has been looked at through many rounds of model changes since, so the ``holdout`` rounds are the honest test.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

import numpy as np
from scipy.optimize import least_squares

from autoresearch_dagster.emulator.catalog import SAME_DIE, GPUSpec, gpu, model_card
from autoresearch_dagster.emulator.core import EmuRequest, EngineCore
from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.emulator.engine_view import vllm_async_by_default, vllm_gpu_defaults
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.sim import SimResult, simulate, simulate_closed_loop
from autoresearch_dagster.spec import SpecError

Split = Literal["fit", "report", "holdout"]
METRICS = ("median_tpot_ms", "median_ttft_ms", "median_itl_ms", "output_throughput", "total_token_throughput")
SHAREGPT_MAX_PROMPT = 1024  # vllm bench serve / sglang bench_serving drop longer ShareGPT prompts ...
SHAREGPT_MAX_TOTAL = 2048  # ... and prompt + output above this
SHAREGPT_MIN = 4
SHAREGPT_SIGMA_IN, SHAREGPT_SIGMA_OUT = 1.1, 0.9  # spread of log lengths (heavy-tailed chat turns)
# Bounds of the factors a fit may move (achieved fractions in (0, 1], CPU and fixed latencies in seconds)
FIT_BOUNDS = {"gemm_mfu": (0.2, 0.95), "fp8_mfu": (0.1, 0.95), "w8a16_mfu": (0.1, 0.95), "fp8_layer_s": (0.0, 2e-4), "moe_mfu": (0.1, 0.95), "attn_mfu": (0.1, 0.95), "mbu": (0.4, 0.95),
              "kv_mbu": (0.2, 0.95), "comm_eff": (0.2, 0.95), "step_overhead_s": (1e-5, 5e-3),
              "per_req_overhead_s": (1e-7, 1e-4), "eager_layer_s": (1e-6, 1e-3), "kernel_floor_s": (1e-7, 5e-5),
              "decode_req_layer_s": (0.0, 1e-5), "request_in_s": (0.0, 0.05), "request_out_s": (0.0, 0.05),
              "frontend_req_s": (0.0, 0.05), "vllm_request_in_s": (0.0, 0.2),
              "vllm_frontend_req_s": (0.0, 0.02), "moe_n_half": (0.0, 4096.0)}


def split_of(point_id: str) -> Split:
    """The fixed split rule: the parity of the first byte of sha256(id)."""
    return "fit" if hashlib.sha256(point_id.encode()).digest()[0] % 2 == 0 else "report"


@dataclass(frozen=True)
class Workload:
    kind: Literal["concurrency", "offline", "rate"]
    dataset: Literal["sharegpt", "random"]
    num_prompts: int
    concurrency: int | None = None
    rate_rps: float | None = None
    input_len: int | None = None
    output_len: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None


@dataclass(frozen=True)
class Point:
    id: str
    source: str
    url: str
    source_quote: tuple[str, ...]
    engine: str
    engine_version: str
    model: str
    gpu: str
    tp: int
    weights: str
    kv_dtype: str
    workload: Workload
    metric: str
    value: float
    unit: str
    split: Split
    config: dict[str, Any] = field(default_factory=dict)
    note: str | None = None
    added: str | None = None  # date a point was added after the first table; its split is then declared
    round: int = 1  # which batch of added points (each holdout round is reported on its own, once unseen)


def _point(d: dict[str, Any], where: str) -> Point:
    try:
        w = Workload(**d["workload"])
        p = Point(**{**d, "workload": w, "source_quote": tuple(d["source_quote"])})
    except (KeyError, TypeError) as e:
        raise SpecError(f"{where}: point {d.get('id', '?')!r} is malformed: {e}") from None
    if p.metric not in METRICS:
        raise SpecError(f"{where}: point {p.id!r} has unknown metric {p.metric!r}; known: {', '.join(METRICS)}")
    if p.added is None and p.split != split_of(p.id):
        raise SpecError(f"{where}: point {p.id!r} is marked {p.split!r} but the split rule puts it in {split_of(p.id)!r}")
    if p.added is None and p.round != 1:
        raise SpecError(f"{where}: point {p.id!r} names a round but no 'added' date")
    if p.added is not None and p.split not in ("fit", "holdout"):
        raise SpecError(f"{where}: point {p.id!r}, added {p.added}, must be declared 'fit' or 'holdout', not {p.split!r}")
    if not p.source_quote or not p.url.startswith("https://"):
        raise SpecError(f"{where}: point {p.id!r} needs a source URL and the source's own lines")
    if w.kind == "concurrency" and not w.concurrency or w.kind == "rate" and not w.rate_rps:
        raise SpecError(f"{where}: point {p.id!r}: a {w.kind} workload needs its concurrency or rate")
    if w.dataset == "random" and not (w.input_len and w.output_len):
        raise SpecError(f"{where}: point {p.id!r}: a random workload needs input_len and output_len")
    if w.dataset == "sharegpt" and not (w.total_input_tokens and w.total_output_tokens):
        raise SpecError(f"{where}: point {p.id!r}: a ShareGPT workload needs the totals the source printed")
    return p


def read_table(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON table file's object; SpecError (one line) naming ``what`` when it cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"{what} {path} cannot be read: {e}") from None


def load_table(path: str | Path) -> list[Point]:
    """The validation points of a table file; SpecError (one line) on a malformed or mis-split point."""
    data = read_table(path, "validation table")
    points = [_point(d, str(path)) for d in data.get("points", [])]
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise SpecError(f"{path}: repeated point ids")
    return points


# ------------------------------------------------------------------------------------------ workloads

def sharegpt_lengths(n: int, mean_in: float, mean_out: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (prompt, output) lengths: lognormal, clipped as the bench clients filter ShareGPT, medians
    adjusted until the means equal ``mean_in`` / ``mean_out`` (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    z_in, z_out = rng.normal(0, SHAREGPT_SIGMA_IN, n), rng.normal(0, SHAREGPT_SIGMA_OUT, n)
    med_in, med_out = mean_in * 0.6, mean_out * 0.7
    for _ in range(40):
        p = np.clip(np.round(med_in * np.exp(z_in)), SHAREGPT_MIN, SHAREGPT_MAX_PROMPT)
        o = np.clip(np.round(med_out * np.exp(z_out)), SHAREGPT_MIN, SHAREGPT_MAX_TOTAL - p)
        med_in *= mean_in / p.mean()
        med_out *= mean_out / o.mean()
    return p.astype(int), o.astype(int)


def random_lengths(n: int, length: int, total: int | None, rng: np.random.Generator) -> np.ndarray:
    """A random dataset's lengths: ``length`` each, unless the printed ``total`` says otherwise (more than 5% off
    ``n x length``): below, uniform in [lo, length] with the printed mean; above, the printed mean each. Below
    happens when sglang.bench_serving draws lengths uniformly from ``length x random_range_ratio`` to ``length``
    (its default ratio is 0), and when generations stop at EOS before ``output_len`` (a client run without
    ``--ignore-eos``: 16 of the table's fixed-length vLLM runs printed 52-94% of the requested output tokens); the
    uniform shape is a stand-in there, the printed mean is what the replay keeps."""
    if not total or abs(total / (n * length) - 1.0) <= 0.05:
        return np.full(n, length)
    mean = total / n
    if mean > length:
        return np.full(n, max(1, round(mean)))
    return rng.integers(max(1, round(2 * mean - length)), length + 1, n)


def point_requests(w: Workload, seed: int = 0) -> list[EmuRequest]:
    """The requests a workload sends, in send order (arrival times for ``offline`` / ``rate``)."""
    n = w.num_prompts
    if w.dataset == "random":
        rng = np.random.default_rng(seed + 2)
        prompts = random_lengths(n, w.input_len, w.total_input_tokens, rng)
        outs = random_lengths(n, w.output_len, w.total_output_tokens, rng)
    else:
        prompts, outs = sharegpt_lengths(n, w.total_input_tokens / n, w.total_output_tokens / n, seed)
    if w.kind == "rate":
        arrivals = np.cumsum(np.random.default_rng(seed + 1).exponential(1.0 / w.rate_rps, n))
    else:
        arrivals = np.zeros(n)
    # unique prompts: no prefix-cache hits, as with ShareGPT / random prompts
    return [EmuRequest(f"v{i}", int(prompts[i]), int(outs[i]), [], 64, float(arrivals[i])) for i in range(n)]


def server_config(p: Point, hw: GPUSpec) -> dict[str, Any]:
    """The SGLang config the emulator runs a point with: the point's own, over vLLM's GPU defaults for a vLLM run
    (``engine_view.vllm_gpu_defaults``: its per-device batch and token budget, mixed steps, synchronous up to the
    release that made async scheduling the default, its KV
    sizing), SGLang's defaults otherwise."""
    if p.engine != "vllm":
        return dict(p.config)
    card = model_card(p.model)
    fp8 = p.weights == "fp8"
    base = vllm_gpu_defaults(card, hw, tp=p.tp, max_num_seqs=p.config.get("max_running_requests"),
                             max_num_batched_tokens=p.config.get("chunked_prefill_size"),
                             gpu_memory_utilization=p.config.get("mem_fraction_static"), fp8_weights=fp8,
                             async_scheduling=vllm_async_by_default(p.engine_version))
    return {**base, **{k: v for k, v in p.config.items() if k != "mem_fraction_static"}}


def run_point(p: Point, eff: Efficiency | None = None, seed: int = 0,
              gpus: dict[str, GPUSpec] | None = None) -> dict[str, float]:
    """Replay one point's workload on the emulator (noise off, the point's server config): its figures.
    ``gpus``: catalog entries to use instead of the catalog's (a fit's per-GPU scales)."""
    hw = (gpus or {}).get(p.gpu.upper()) or gpu(p.gpu)
    if p.engine == "vllm":
        eff = eff or Efficiency()
        eff = eff.replace(request_in_s=eff.request_in_s + eff.vllm_request_in_s,
                          frontend_req_s=eff.frontend_req_s + eff.vllm_frontend_req_s)
    core = EngineCore(model_card(p.model), hw, p.tp, server_config(p, hw), seed=seed, noise=NoiseSettings.off(),
                      efficiency=eff)
    reqs = point_requests(p.workload, seed)
    if p.workload.kind == "concurrency":
        res = simulate_closed_loop(core, reqs, p.workload.concurrency)
    else:
        res = simulate(core, reqs, sample_interval_s=3600.0, start_s=0.0)
    return metrics_of(res, {r.rid: r.prompt_tokens for r in reqs})


def metrics_of(res: SimResult, prompt_tokens: dict[str, int]) -> dict[str, float]:
    """The bench clients' figures (vllm bench serve / sglang.bench_serving definitions) from a replay."""
    ok = [r for r in res.requests if r.status == "ok"]
    if len(ok) < len(res.requests):
        raise SpecError(f"{len(res.requests) - len(ok)} of {len(res.requests)} requests failed in the replay")
    dur = max(r.end_s for r in ok) - min(r.arrival_s for r in ok)
    out = sum(r.output_tokens for r in ok)
    tokens_in = sum(prompt_tokens[r.rid] for r in ok)
    tpot = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = np.concatenate([r.itl_s(res.stream_interval) for r in ok] or [np.zeros(1)])
    return {"median_tpot_ms": 1e3 * float(np.median(tpot)) if tpot else math.nan,
            "median_ttft_ms": 1e3 * float(np.median([r.ttft_s for r in ok])),
            "median_itl_ms": 1e3 * float(np.median(itl)),
            "output_throughput": out / dur, "total_token_throughput": (out + tokens_in) / dur}


def predict(p: Point, eff: Efficiency | None = None, gpus: dict[str, GPUSpec] | None = None) -> float:
    return run_point(p, eff, gpus=gpus)[p.metric]


# ------------------------------------------------------------------------------------------ errors

@dataclass(frozen=True)
class Row:
    point: Point
    predicted: float

    @property
    def error(self) -> float:
        """Signed relative error of the prediction (+0.10 = predicted 10% above the published value)."""
        return self.predicted / self.point.value - 1.0


def evaluate(points: Iterable[Point], eff: Efficiency | None = None,
             gpus: dict[str, GPUSpec] | None = None) -> list[Row]:
    return [Row(p, predict(p, eff, gpus)) for p in points]


def summary(rows: list[Row]) -> dict[str, float]:
    """Median and worst |relative error| of some rows (NaN when there are none)."""
    errs = np.abs([r.error for r in rows])
    if not len(errs):
        return {"n": 0, "median_abs_error": math.nan, "worst_abs_error": math.nan}
    return {"n": len(errs), "median_abs_error": float(np.median(errs)), "worst_abs_error": float(errs.max())}


# ------------------------------------------------------------------------------------------ fit

GPU_SCALES = ("mfu_scale", "mbu_scale")  # per-GPU fit parameters, named gpu.<NAME>.<scale>
GPU_SCALE_BOUNDS = (0.3, 2.0)


def _bounds(name: str) -> tuple[float, float]:
    if name.startswith("gpu."):
        return GPU_SCALE_BOUNDS
    return FIT_BOUNDS[name]


def _is_fittable(name: str) -> bool:
    if name.startswith("gpu."):
        parts = name.split(".")
        return len(parts) == 3 and parts[2] in GPU_SCALES and _known_gpu(parts[1])
    return name in FIT_BOUNDS


def _known_gpu(name: str) -> bool:
    try:
        gpu(name)
    except SpecError:
        return False
    return True


def gpus_with(scales: dict[str, float]) -> dict[str, GPUSpec]:
    """Catalog GPUs with the per-GPU scales ``{"gpu.A100.mfu_scale": 1.1, ...}`` applied (only those named, and the
    GPUs on the same die: ``catalog.SAME_DIE``)."""
    out: dict[str, GPUSpec] = {}
    for name, v in scales.items():
        _, g, field_ = name.split(".")
        for target in [g.upper()] + [d for d, src in SAME_DIE.items() if src == g.upper()]:
            base = out.get(target) or gpu(target)
            out[target] = dataclasses.replace(base, **{field_: float(v)})
    return out


@dataclass
class FitResult:
    efficiency: Efficiency
    params: dict[str, float]
    before: dict[str, float]
    after: dict[str, float]
    n_evals: int
    message: str
    gpus: dict[str, GPUSpec] = field(default_factory=dict)  # the fitted per-GPU scales applied


def fit(points: list[Point], params: tuple[str, ...], start: Efficiency | None = None, *,
        max_evals: int = 300) -> FitResult:
    """Fit ``params`` on ``points`` (the ``fit`` half only: refuses ``report`` points) by bounded least squares on
    log(predicted / published), soft-L1 loss so one odd point cannot dominate. A parameter is an ``Efficiency``
    field or a per-GPU scale ``gpu.<NAME>.mfu_scale`` / ``gpu.<NAME>.mbu_scale`` (``GPUSpec``)."""
    if any(p.split != "fit" for p in points):
        raise SpecError("the fit sees only the table's 'fit' half")
    unknown = [k for k in params if not _is_fittable(k)]
    if unknown:
        raise SpecError(f"cannot fit {', '.join(unknown)}; fittable: {', '.join(FIT_BOUNDS)}, "
                        f"gpu.<NAME>.{{{','.join(GPU_SCALES)}}}")
    base = start or Efficiency()

    def value0(k: str) -> float:
        if k.startswith("gpu."):
            _, g, f = k.split(".")
            return float(getattr(gpu(g), f))
        return float(getattr(base, k))

    scale = np.array([max(value0(k), _bounds(k)[1] * 1e-2) for k in params])
    lo = np.array([_bounds(k)[0] for k in params]) / scale
    hi = np.array([_bounds(k)[1] for k in params]) / scale
    x0 = np.clip(np.array([value0(k) for k in params]) / scale, lo, hi)
    evals = 0

    def split_of_x(x: np.ndarray) -> tuple[Efficiency, dict[str, GPUSpec]]:
        vals = {k: float(v * s) for k, v, s in zip(params, x, scale)}
        eff = base.replace(**{k: v for k, v in vals.items() if not k.startswith("gpu.")})
        return eff, gpus_with({k: v for k, v in vals.items() if k.startswith("gpu.")})

    def residuals(x: np.ndarray) -> np.ndarray:
        nonlocal evals
        evals += 1
        e, g = split_of_x(x)
        return np.array([math.log(max(predict(p, e, g), 1e-9) / p.value) for p in points])

    before = summary(evaluate(points, base))
    sol = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, diff_step=0.02,
                        max_nfev=max_evals)
    eff, g = split_of_x(sol.x)
    fitted = {k: float(v * s) for k, v, s in zip(params, sol.x, scale)}
    return FitResult(eff, fitted, before, summary(evaluate(points, eff, g)), evals, sol.message, g)


# ------------------------------------------------------------------------------------------ calibration transfer

def endpoint_key(p: Point) -> tuple[str, ...]:
    """What a calibration belongs to: engine and version, model and GPU type. TP, weight and KV dtypes and the
    server flags are settings a campaign changes (``tp_size``, ``quantization``, ``kv_cache_dtype``, ...)."""
    return (p.engine, p.engine_version, p.model, p.gpu.upper())


def same_traffic(a: Workload, b: Workload, *, rel: float = 0.05) -> bool:
    """Whether two runs sent the same traffic: the same kind, dataset and load (concurrency / rate) and lengths
    (ShareGPT: printed totals within ``rel``, as re-runs of one sample differ by the requests the server truncated)."""
    if (a.kind, a.dataset, a.num_prompts, a.concurrency, a.rate_rps) != (b.kind, b.dataset, b.num_prompts,
                                                                         b.concurrency, b.rate_rps):
        return False
    if a.dataset == "random":
        return (a.input_len, a.output_len) == (b.input_len, b.output_len)
    return all(abs(x / y - 1.0) <= rel for x, y in ((a.total_input_tokens, b.total_input_tokens),
                                                    (a.total_output_tokens, b.total_output_tokens)))


def _settings(p: Point) -> tuple[Any, ...]:
    return (p.tp, p.weights, p.kv_dtype, sorted(p.config.items()))


def _same_run(a: Point, b: Point) -> bool:
    return a.workload == b.workload and _settings(a) == _settings(b)


def anchor_of(group: list[Point]) -> Point | None:
    """The run a calibration of an endpoint measures first: its ShareGPT total-throughput run with the fewest
    settings of its own and 16-bit weights (the baseline), ties by id; None when the endpoint has no ShareGPT run."""
    base = [p for p in group if p.workload.dataset == "sharegpt" and p.metric == "total_token_throughput"]
    return min(base, key=lambda p: (len(p.config) - ("tp_size" in p.config), p.weights != "bf16", p.kv_dtype != "bf16",
                                    p.id)) if base else None


def calibrate_on(anchor: Point, params: tuple[str, ...], *, start: Efficiency | None = None,
                 prior_weight: float = 0.1, max_evals: int = 40) -> Efficiency:
    """The factors ``params`` fitted to one measured run (least squares on log(predicted / measured), with
    ``calibrate.calibrate``'s Gaussian prior on the log-factors around ``start``: one run cannot pin two factors,
    the prior picks the smallest move that explains it)."""
    from autoresearch_dagster.emulator.calibrate import fittable

    base = start or Efficiency()
    x0 = np.log([getattr(base, k) for k in params])
    lo = np.log([fittable()[k][0] for k in params])
    hi = np.log([fittable()[k][1] for k in params])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def eff_of(x: np.ndarray) -> Efficiency:
        return base.replace(**{k: float(v) for k, v in zip(params, np.exp(x))})

    def residuals(x: np.ndarray) -> np.ndarray:
        r = math.log(max(predict(anchor, eff_of(x)), 1e-9) / anchor.value)
        return np.concatenate([[r], prior_weight * (x - x0)])

    sol = least_squares(residuals, x0, bounds=(lo, hi), diff_step=0.05, max_nfev=max_evals, method="trf")
    return eff_of(sol.x)


@dataclass(frozen=True)
class TransferRow:
    point: Point
    anchor: Point
    default: float  # predicted with the default factors
    calibrated: float  # predicted after calibrating on the anchor run
    efficiency: Efficiency
    anchor_default: float  # the anchor run's own prediction with the default factors

    @property
    def priced_change(self) -> float:
        """How much the default emulator says this run's settings change the anchor's figure (0: a no-op to it)."""
        return self.default / self.anchor_default - 1.0 if self.point.metric == self.anchor.metric else math.nan

    @property
    def default_error(self) -> float:
        return self.default / self.point.value - 1.0

    @property
    def error(self) -> float:
        return self.calibrated / self.point.value - 1.0


def transfer(points: Iterable[Point], *, prior_weight: float = 0.1,
             defaults: dict[str, float] | None = None) -> list[TransferRow]:
    """The product's calibrate-then-predict on real endpoints: per endpoint (``endpoint_key``) with a ShareGPT run
    and other runs, calibrate the factors a load curve pins (``calibrate.default_params``: HBM streaming and the
    model's GEMM rate) on that one run (``calibrate_on``), then predict the endpoint's other runs (other
    workloads, other settings: TP, weights, KV dtype, flags); the anchor run's other metrics are left out (same run).
    ``same_traffic`` tells the campaign's case (the same traffic under other settings) from extrapolation.
    ``defaults``: the points' predictions with the default factors where already made (``evaluate``), by id."""
    from autoresearch_dagster.emulator.calibrate import default_params

    groups: dict[tuple[str, ...], list[Point]] = {}
    for p in points:
        groups.setdefault(endpoint_key(p), []).append(p)
    rows: list[TransferRow] = []
    for key in sorted(groups):
        group = groups[key]
        anchor = anchor_of(group)
        others = [p for p in group if anchor is not None and not _same_run(p, anchor)]
        if not others:
            continue
        eff = calibrate_on(anchor, default_params(anchor.model), prior_weight=prior_weight)
        made = defaults or {}
        default = {p.id: made[p.id] if p.id in made else predict(p) for p in [anchor, *others]}
        rows += [TransferRow(p, anchor, default[p.id], predict(p, eff), eff, default[anchor.id]) for p in others]
    return rows


# ------------------------------------------------------------------------------------------ engine gap

# Both runs of a pair within +-25% needs the predicted engine ratio within this factor of the published one.
PAIR_BAND = (0.75 / 1.25, 1.25 / 0.75)


@dataclass(frozen=True)
class EnginePair:
    """SGLang and vLLM on one source page: same model, GPU, TP, dtypes, traffic and metric; only the engine (and
    its version and flags) differs, so the published ratio isolates what the engines' implementations make of the
    same hardware and requests."""
    sglang: Row
    vllm: Row

    @property
    def published_ratio(self) -> float:
        return self.sglang.point.value / self.vllm.point.value

    @property
    def predicted_ratio(self) -> float:
        return self.sglang.predicted / self.vllm.predicted

    @property
    def ratio_error(self) -> float:
        return self.predicted_ratio / self.published_ratio - 1.0

    @property
    def out_of_band(self) -> bool:
        """No change to the factors both engines share can put both runs within +-25%: their ratio does not move."""
        return not PAIR_BAND[0] <= 1.0 + self.ratio_error <= PAIR_BAND[1]


def engine_pairs(rows: Iterable[Row]) -> list[EnginePair]:
    """The SGLang/vLLM pairs among scored rows: per setup (source URL, model, GPU, TP, weights, KV dtype, metric
    and ``same_traffic``) with both engines, each engine's run with the fewest flags of its own (ties by id)."""
    setups: dict[tuple[Any, ...], list[Row]] = {}
    for r in sorted(rows, key=lambda r: (len(r.point.config), r.point.id)):
        p = r.point
        setups.setdefault((p.url, p.model, p.gpu.upper(), p.tp, p.weights, p.kv_dtype, p.metric), []).append(r)
    pairs = []
    for _, group in sorted(setups.items(), key=lambda kv: str(kv[0])):
        for s in (r for r in group if r.point.engine == "sglang"):
            v = next((r for r in group if r.point.engine == "vllm" and same_traffic(r.point.workload, s.point.workload)),
                     None)
            if v is not None and not any(q.vllm is v for q in pairs):  # a re-run of the SGLang side: its first
                pairs.append(EnginePair(s, v))
    return pairs
