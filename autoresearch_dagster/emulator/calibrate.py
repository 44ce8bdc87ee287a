"""Owns calibration: fit the emulator's efficiency factors to a measured load curve.

Given the load curve of a real endpoint (per load step: arrival rate and latency percentiles, as
``measure.step.LoadStep`` / the results lake store them), the same replay pool and server config,
``calibrate`` replays each step's rate in the virtual-time emulator (noise off, fixed seeds, the
runner's own schedule builder and step summary) and fits chosen ``Efficiency`` factors by
bounded non-linear least squares (``scipy.optimize.least_squares``) on log-ratios of predicted to
measured percentiles. It reports the fitted factors and the remaining error per metric. Points may carry the config they
were measured on, so one fit can span a baseline and candidates (what a drift re-calibration does:
the configs' differences are what the campaign's predictions are about).

Identifiability: decode (TPOT/ITL at low load) is memory-bound and pins ``mbu``; prefill (TTFT of
long prompts) is compute-bound and pins ``gemm_mfu`` (``moe_mfu`` for MoE models). A per-step
overhead and ``mbu`` trade off against each other on a single model's load curve (both stretch
every decode step), so ``step_overhead_s`` is only worth fitting together with step timings from
a profile or with a second model size. Fit only what the curve can see.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.measure.profiles import REQUEST_TIMEOUT_S
from autoresearch_dagster.spec import SpecError

DEFAULT_PARAMS = ("gemm_mfu", "mbu")
DEFAULT_METRICS = (("ttft_ms", "p50"), ("tpot_ms", "p50"), ("itl_ms", "p50"), ("ttft_ms", "p95"), ("tpot_ms", "p95"))
# Fit bounds of every Efficiency factor (the fit runs on their logs, so lower bounds are positive). Fractions of
# peak anywhere in [0.05, 1] (mbu, kv_mbu from 0.1: no decode streams weights slower than that); CPU and GPU
# times from negligible to clearly beyond any measured engine:
# - step_overhead_s 10 us .. 50 ms per scheduler iteration; per_req_overhead_s 0.01 us .. 1 ms per running request;
# - eager_layer_s 1 us .. 1 ms of launches per layer outside a CUDA graph (~10-15 kernels x 5-10 us at the default);
# - kernel_floor_s 0.1 us .. 100 us, a layer's kernels at tiny batch (one kernel launch is ~2-5 us);
# - decode_req_layer_s 0.1 ns .. 10 us per decoding request and attention layer (10 us would make a 100-request
#   decode of a 32-layer model spend 32 ms in per-sequence attention work alone, more than whole measured steps);
# - fp8_layer_s 0.1 us .. 0.5 ms of activation-quantization kernels per layer (a few small kernels);
# - request_in_s, request_out_s 0.1 ms .. 100 ms of fixed latency before the scheduler (HTTP, chat template,
#   tokenization of a long prompt on a busy frontend) and from a step to the client (detokenizer, streaming);
#   vllm_request_in_s up to 200 ms on top of it where the emulator stands in for vLLM's API server;
# - vllm_frontend_req_s 10 us .. 50 ms on top of frontend_req_s there (vLLM's one API server process);
# - moe_n_half 1 .. 8192 columns: the per-rank expert width at half the grouped GEMMs' efficiency;
# - frontend_req_s 10 us .. 50 ms of the single frontend process's CPU per request (20 .. 100,000 requests/s).
BOUNDS = {"gemm_mfu": (0.05, 1.0), "moe_mfu": (0.05, 1.0), "attn_mfu": (0.05, 1.0), "mbu": (0.1, 1.0),
          "kv_mbu": (0.1, 1.0), "comm_eff": (0.05, 1.0), "step_overhead_s": (1e-5, 0.05),
          "per_req_overhead_s": (1e-8, 1e-3), "eager_layer_s": (1e-6, 1e-3), "kernel_floor_s": (1e-7, 1e-4),
          "fp8_mfu": (0.05, 1.0), "w8a16_mfu": (0.05, 1.0), "decode_req_layer_s": (1e-10, 1e-5),
          "fp8_layer_s": (1e-7, 5e-4), "request_in_s": (1e-4, 0.1), "request_out_s": (1e-4, 0.1),
          "frontend_req_s": (1e-5, 0.05), "vllm_request_in_s": (1e-4, 0.2),
          "vllm_frontend_req_s": (1e-5, 0.05), "moe_n_half": (1.0, 8192.0)}


def fittable() -> dict[str, tuple[float, float]]:
    """Every Efficiency factor with its fit bounds (``BOUNDS``, which a test keeps complete), in field order."""
    return {f.name: BOUNDS[f.name] for f in fields(Efficiency)}


def default_params(model: str) -> tuple[str, ...]:
    """What a load curve pins: memory-bound decode (``mbu``) and compute-bound prefill (``gemm_mfu``, or
    ``moe_mfu`` for an MoE model)."""
    from autoresearch_dagster.emulator.catalog import model_card

    return ("mbu", "moe_mfu" if model_card(model).is_moe else "gemm_mfu")


def endpoint_params(endpoint: Any) -> tuple[str, ...]:
    """The factors a calibration of ``endpoint`` fits: its ``engine_options.calibrate_params`` (what a CPU engine's
    curve pins), else ``default_params`` of the model the emulator sees for it (``engine_view``)."""
    from autoresearch_dagster.emulator.engine_view import emulator_view

    own = endpoint.engine_options.get("calibrate_params")
    return tuple(own) if own else default_params(emulator_view(endpoint, {}).endpoint.model)


@dataclass
class CurvePoint:
    """One measured load step: the arrival rate and latency percentiles in ms ({"ttft_ms": {"p50": ...}, ...})."""
    rate_rps: float
    metrics: dict[str, dict[str, float | None]]
    duration_s: float = 60.0
    seed: int = 0
    config: dict[str, Any] | None = None  # the server config it was measured on (None: the one ``calibrate`` gets)
    # the measured step's own sends and first pool row (``measured_arrivals``): replayed as they were, not redrawn
    offsets: list[float] | None = None
    start_index: int | None = None


@dataclass
class CalibrationResult:
    efficiency: Efficiency
    params: dict[str, float]
    initial_error: dict[str, float]  # metric -> mean |relative error| before fitting
    error: dict[str, float]  # metric -> mean |relative error| after fitting
    max_error: dict[str, float]  # metric -> worst |relative error| after fitting
    n_evals: int
    success: bool
    message: str
    predictions: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.params, "initial_error": self.initial_error, "error": self.error,
                "max_error": self.max_error, "n_evals": self.n_evals, "success": self.success,
                "message": self.message, "predictions": self.predictions}


def curve_points(steps: list[Any], *, duration_s: float | None = None) -> list[CurvePoint]:
    """CurvePoints from LoadStep objects, their dicts, or the results lake's flat ``load_steps`` rows
    (``ttft_p50_ms``, ...). Warm-ups, steps with nothing completed and invalid steps are dropped."""
    out = []
    for i, s in enumerate(steps):
        d = s if isinstance(s, dict) else s.to_dict()
        if d.get("kind") == "warmup" or d.get("n_ok") == 0 or d.get("valid") is False:
            continue
        metrics: dict[str, dict[str, float | None]] = {}
        for m in ("ttft", "tpot", "itl", "e2e"):
            nested = d.get(f"{m}_ms")
            if isinstance(nested, dict):
                metrics[f"{m}_ms"] = nested
            else:
                flat = {q: d.get(f"{m}_{q}_ms") for q in ("p50", "p95", "p99")}
                if any(v is not None for v in flat.values()):
                    metrics[f"{m}_ms"] = flat
        if not metrics:
            continue
        dur = duration_s or send_window_s(d)
        sends = measured_arrivals(d)
        out.append(CurvePoint(float(d["rate_rps"]), metrics, duration_s=dur, seed=i, offsets=sends,
                              start_index=d.get("start_index") if sends is not None else None))
    return out


def measured_arrivals(step: dict[str, Any]) -> list[float] | None:
    """The send offsets a measured Poisson step used, redrawn from its recorded ``arrival_seed`` and ``burstiness``
    (``measure.step.arrival_offsets``) and checked against its recorded offered rate; None when the step does not
    record them or the redraw does not match (then the point replays a fresh draw at its rate).

    Replaying the measured sends matters at the short low-rate steps a search starts with: 20-30 requests whose
    realized rate is 0.7-1.5x the target (a step asked for 2 req/s offered 1.39 on the vLLM baseline) and whose
    output lengths are heavy-tailed, so a fresh draw of rate and pool rows is a different load."""
    seed, start = step.get("arrival_seed"), step.get("start_index")
    if seed is None or start is None:
        return None
    return _redraw(step, int(seed), float(step.get("burstiness") or 1.0))


def _redraw(step: dict[str, Any], seed: int, burstiness: float) -> list[float] | None:
    """The first ``n_sent`` sends of the arrival stream for (the step's rate, ``seed``, ``burstiness``), or None
    when their span does not give the step's recorded offered rate ((n - 1) / span, ``summarize_step``'s)."""
    n, rate = int(step.get("n_sent") or 0), float(step.get("rate_rps") or 0.0)
    if n < 1 or rate <= 0:
        return None
    from autoresearch_dagster.measure.step import arrival_offsets

    offsets = arrival_offsets(rate, n, seed=seed, burstiness=burstiness)
    offered = step.get("offered_rps")
    if n > 1 and offered:
        span = offsets[-1] - offsets[0]
        if span <= 0 or not math.isclose((n - 1) / span, float(offered), rel_tol=1e-6):
            return None
    return offsets


def infer_arrivals(steps: list[dict[str, Any]], *, burstiness: float = 1.0, max_run_seed: int = 1000) -> list[dict[str, Any]]:
    """``steps`` (one capacity search, in the order run, warm-up included) with ``arrival_seed``, ``start_index`` and
    ``burstiness`` filled in where a file written before they were recorded lacks them: ``find_capacity`` draws step
    ``k`` with seed ``run_seed x 1000 + k`` from pool row = the sends before it, so the run's seed is the one (of
    0..``max_run_seed - 1``) whose redraws reproduce every step's recorded offered rate. Unchanged when none does
    (or every step already records its arrivals)."""
    if not steps or all(s.get("arrival_seed") is not None for s in steps):
        return steps
    starts, total = [], 0
    for s in steps:
        starts.append(total)
        total += int(s.get("n_sent") or 0)
    checks = sorted((k for k, s in enumerate(steps) if int(s.get("n_sent") or 0) > 1 and s.get("offered_rps")),
                    key=lambda k: int(steps[k]["n_sent"]))
    if not checks:
        return steps
    for run_seed in range(max_run_seed):
        if all(_redraw(steps[k], run_seed * 1000 + k, burstiness) is not None for k in checks):
            return [{**s, "arrival_seed": run_seed * 1000 + k, "start_index": starts[k], "burstiness": burstiness}
                    if s.get("arrival_seed") is None else s for k, s in enumerate(steps)]
    return steps


def send_window_s(step: dict[str, Any]) -> float:
    """How long a measured step sent for: the span of its sends ((n - 1) / offered rate), not its ``duration_s``,
    which runs on until the last response (at a loaded step the drain adds half the window and more; replaying the
    rate that much longer would overload the emulator where the engine was not)."""
    n, offered = int(step.get("n_sent") or 0), float(step.get("offered_rps") or 0.0)
    if n > 1 and offered > 0:
        return (n - 1) / offered
    return float(step.get("duration_s") or 60.0)


def below_knee(steps: list[dict[str, Any]], *, fraction: float = 0.7, keep: int | None = None) -> list[dict[str, Any]]:
    """The valid load steps that met the SLA at no more than ``fraction`` x the highest passing rate (the last
    ``keep`` of them by rate, when given): below the knee latencies reflect step times, not queueing, which no
    efficiency factor explains (near the knee a few percent of speed moves TTFT by multiples)."""
    passing = [s for s in steps if s.get("meets_sla") and s.get("valid", True) is not False
               and s.get("kind") != "warmup"]
    top = max((s.get("rate_rps") or 0 for s in passing), default=0.0)
    usable = sorted((s for s in passing if (s.get("rate_rps") or 0) <= fraction * top), key=lambda s: s.get("rate_rps") or 0)
    return usable[-keep:] if keep else usable


def predict(endpoint: Any, config: dict[str, Any], pool: Any, points: list[CurvePoint], eff: Efficiency, *,
            request_timeout_s: float = REQUEST_TIMEOUT_S) -> list[Any]:
    """The emulator's LoadStep for each point's rate (noise off; the runner's own step).

    ``request_timeout_s``: the timeout the measured steps ran with (their profile's), so that the
    predicted and the measured percentiles are over the same completed requests."""
    from autoresearch_dagster.engines.emulator import VirtualDeployment
    from autoresearch_dagster.measure.step import run_offsets, step_offsets

    out = []
    for k, p in enumerate(points):
        dep = VirtualDeployment(endpoint, config if p.config is None else p.config, seed=p.seed,
                                noise=NoiseSettings.off(), efficiency=eff,
                                sample_interval_s=0)
        if p.offsets is not None:
            offsets, first = p.offsets, p.start_index or 0
        else:
            offsets = step_offsets(p.rate_rps, p.duration_s, seed=p.seed)
            first = k * len(offsets)
        out.append(run_offsets(dep, pool, offsets, endpoint.sla, rate_rps=p.rate_rps, model=endpoint.model,
                               seed=p.seed, step_id=f"cal{k}", request_timeout_s=request_timeout_s,
                               start_index=first).step)
    return out


def replay_measured(endpoint: Any, config: dict[str, Any], steps: list[dict[str, Any]], pool: Any, eff: Efficiency, *,
                    request_timeout_s: float = REQUEST_TIMEOUT_S) -> list[tuple[dict[str, Any], Any]]:
    """Each measured step a calibration could use (``curve_points``' filter) beside the emulator's LoadStep for the
    same sends (``measured_arrivals``; a fresh draw at its rate where the step does not record them).

    This is how far the emulator is off where a config was measured, step by step, without the capacity search's
    own draw in the comparison: a search at a 2-16-slot queue with 20-80 heavy-tailed requests a step moves its
    capacity by tens of percent from one draw to the next, so a predicted-vs-measured capacity mixes the model's
    error with that noise."""
    pairs = []
    for i, s in enumerate(steps):
        pts = curve_points([s])
        if pts:
            pairs.append((s, replace(pts[0], seed=i)))
    pred = predict(endpoint, config, pool, [p for _, p in pairs], eff, request_timeout_s=request_timeout_s)
    return [(s, st) for (s, _), st in zip(pairs, pred)]


def _residuals(pred: list[Any], points: list[CurvePoint], metrics) -> tuple[np.ndarray, list[str]]:
    res, names = [], []
    for st, p in zip(pred, points):
        for metric, q in metrics:
            meas = (p.metrics.get(metric) or {}).get(q)
            got = getattr(st, metric, {}).get(q) if st is not None else None
            if meas is None or meas <= 0:
                continue
            res.append(math.log(max(got or 1e-6, 1e-6) / meas))
            names.append(f"{metric}.{q}")
    return np.array(res), names


def _summ(res: np.ndarray, names: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    mean: dict[str, list[float]] = {}
    for r, n in zip(res, names):
        mean.setdefault(n, []).append(abs(math.expm1(r)))
    return ({k: float(np.mean(v)) for k, v in mean.items()}, {k: float(np.max(v)) for k, v in mean.items()})


def calibrate(endpoint: Any, config: dict[str, Any], pool: Any, points: list[CurvePoint], *,
              params: tuple[str, ...] = DEFAULT_PARAMS, start: Efficiency | None = None,
              metrics: tuple[tuple[str, str], ...] = DEFAULT_METRICS, max_evals: int = 60,
              request_timeout_s: float = REQUEST_TIMEOUT_S, restarts: int = 0,
              good_enough: float = 0.10, prior_weight: float = 0.0) -> CalibrationResult:
    """Fit ``params`` of the emulator's Efficiency so its load curve matches ``points`` (measured with
    ``request_timeout_s``: see ``predict``).

    The emulated percentiles move in steps with the factors (a discrete-event run), so a local fit can stop in a
    shallow basin: on the vLLM baseline's 3 lowest steps the fit from the documented factors kept ``gemm_mfu`` at
    0.71 and left TTFT 60% off, where a start from cheaper prefill reaches a few percent. With ``restarts``, when
    the fit's RMS log residual is above ``good_enough``, it is run again from that many scrambled-Sobol starts
    inside the bounds (``scipy.stats.qmc``, fixed seed: deterministic), each with ``max_evals``, and the lowest
    cost wins.

    ``prior_weight`` > 0 adds one residual per factor, ``prior_weight x log(factor / start)``: a Gaussian prior on the
    log-factors centred on ``start``, so a factor the points cannot pin down stays near its start instead of drifting
    to a bound for a sliver of fit (three low-rate steps say little about MoE GEMM rates: unpriored, the campaign's
    surrogate once moved ``moe_mfu`` from 0.76 to 0.11 for 1.3 points of median error and then mispredicted fp8 KV).
    At 0.1, moving a factor by a factor of e costs as much as a 10% miss on one percentile."""
    if not points:
        raise SpecError("calibration needs at least one measured load step")
    unknown = [p for p in params if p not in fittable()]
    if unknown:
        raise SpecError(f"cannot calibrate {unknown}; choose from {sorted(fittable())}")
    base = start or Efficiency()
    x0 = np.log([getattr(base, p) for p in params])
    lo = np.log([fittable()[p][0] for p in params])
    hi = np.log([fittable()[p][1] for p in params])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    evals = [0]
    names_box: list[list[str]] = [[]]

    def eff_of(x: np.ndarray) -> Efficiency:
        return base.replace(**{p: float(v) for p, v in zip(params, np.exp(x))})

    prior_x = x0.copy()

    def fun(x: np.ndarray) -> np.ndarray:
        evals[0] += 1
        pred = predict(endpoint, config, pool, points, eff_of(x), request_timeout_s=request_timeout_s)
        r, names = _residuals(pred, points, metrics)
        names_box[0] = names
        return np.concatenate([r, prior_weight * (x - prior_x)]) if prior_weight > 0 and r.size else r

    r0 = fun(x0)
    if r0.size == 0:
        raise SpecError("the measured load steps carry none of the metrics to fit "
                        f"({', '.join(f'{m}.{q}' for m, q in metrics)})")
    init_mean, _ = _summ(r0, names_box[0])
    sol = least_squares(fun, x0, bounds=(lo, hi), diff_step=0.05, x_scale=1.0, max_nfev=max_evals, method="trf")
    if restarts > 0 and math.sqrt(2 * sol.cost / max(sol.fun.size, 1)) > good_enough:
        from scipy.stats import qmc

        for u in qmc.Sobol(len(params), scramble=True, seed=0).random(restarts):
            x_start = np.clip(lo + u * (hi - lo), lo + 1e-9, hi - 1e-9)
            alt = least_squares(fun, x_start, bounds=(lo, hi), diff_step=0.05, x_scale=1.0, max_nfev=max_evals,
                                method="trf")
            if alt.cost < sol.cost:
                sol = alt
    eff = eff_of(sol.x)
    pred = predict(endpoint, config, pool, points, eff, request_timeout_s=request_timeout_s)
    r, names = _residuals(pred, points, metrics)
    err, worst = _summ(r, names)
    rows = [{"rate_rps": p.rate_rps, **({"config": p.config} if p.config is not None else {}), **{f"{m}.{q}": {"measured": (p.metrics.get(m) or {}).get(q),
                                                      "emulated": getattr(st, m, {}).get(q)} for m, q in metrics}}
            for p, st in zip(points, pred)]
    return CalibrationResult(efficiency=eff, params={p: float(getattr(eff, p)) for p in params},
                             initial_error=init_mean, error=err, max_error=worst, n_evals=evals[0] + 1,
                             success=bool(sol.success), message=str(sol.message), predictions=rows)
