"""Owns the offline proposer's performance model: the emulator as a surrogate of the endpoint, plus what
the campaign's verdicts teach about its errors.

``Surrogate.evaluate`` predicts the capacity of configs at the endpoint's SLA on its replay pool with
the runner's own capacity search in virtual time (noise off, fixed seeds), on the emulator built from
the *documented* efficiency factors or from a calibration on this campaign's measured baseline curves
(``emulator.calibrate``), never from the endpoint engine's own factors: on an emulated endpoint
those are hidden (``emulator.cost.hidden_efficiency``), as a real GPU's are. Results are cached by
config hash and model. An infeasible config (it does not fit in memory, more GPUs than the endpoint
has) comes back infeasible with the engine's reason, so the search learns it without an experiment.

``Corrector`` turns surrogate ratios into predictions: each measured verdict of the campaign leaves a
residual log(measured ratio / surrogate ratio); a new candidate's correction is the residual mean of
the earlier candidates that changed the same knobs (shrunk toward 0 with ``prior_weight``), and its
interval widens with the residual spread and the measurement noise.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.experiments.parallel import map_calls
from autoresearch_dagster.emulator.engine_view import emulator_view
from autoresearch_dagster.spec import EndpointSpec, SpecError, config_hash

Z = {0.5: 0.674, 0.8: 1.2816, 0.9: 1.645, 0.95: 1.96}
# Weight of the calibration's prior on log-factors (emulator.calibrate, prior_weight): the few low-rate baseline steps
# a campaign fits on cannot pin every factor down, and an unpinned one must stay near its documented default.
CALIBRATION_PRIOR = 0.1


@dataclass
class SurrogatePoint:
    config_hash: str
    feasible: bool
    capacity_rps: float = 0.0
    reason: str = ""
    limiting: str = ""  # the SLA term the first failing step broke
    latency_p99_ms: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # metric -> (rate, p99)

    def latency_at(self, metric: str, rate: float) -> float | None:
        """p99 of ``metric`` at ``rate``, interpolated between the search's steps (nearest outside them)."""
        pts = sorted(self.latency_p99_ms.get(metric) or [])
        if not pts:
            return None
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        return float(np.interp(rate, xs, ys))


def _evaluate(endpoint_json: str, pool_path: str, config: dict[str, Any], efficiency: Efficiency,
              capacity: Any, seed: int, key: str | None = None) -> dict[str, Any]:
    """One surrogate point (module level: runs on the worker processes); ``key``: the hash it is cached
    under (the endpoint engine's config, when ``config`` is the emulator's view of it)."""
    from autoresearch_dagster.engines.emulator import VirtualDeployment
    from autoresearch_dagster.emulator.noise import NoiseSettings
    from autoresearch_dagster.experiments.parallel import _worker_pool
    from autoresearch_dagster.measure.capacity import find_capacity

    endpoint = EndpointSpec.model_validate_json(endpoint_json)
    h = key or config_hash(config)
    try:
        dep = VirtualDeployment(endpoint, config, seed=seed, noise=NoiseSettings.off(), efficiency=efficiency,
                                sample_interval_s=0)
    except Exception as e:  # noqa: BLE001 -- the engine refusing a config is the answer (infeasible)
        return asdict(SurrogatePoint(h, False, reason=f"{type(e).__name__}: {e}"[:300]))
    res = find_capacity(dep, _worker_pool(pool_path), endpoint.sla, gpus=endpoint.gpus, model=endpoint.model,
                        settings=capacity, seed=seed)
    cap = res.capacity_interp_rps if res.capacity_interp_rps is not None else res.capacity_rps
    failing = [t for st in res.steps if not st.passed for t in st.failed_terms]
    lat = {m: [(float(st.rate_rps), float(getattr(st, f"{m}_ms").get("p99")))
               for st in res.steps if (getattr(st, f"{m}_ms") or {}).get("p99") is not None]
           for m in ("ttft", "tpot", "itl", "e2e")}
    return asdict(SurrogatePoint(h, bool(res.valid or cap), float(cap or 0.0),
                                 reason="; ".join(res.invalid_reasons)[:300], limiting=str(failing[0]) if failing else "",
                                 latency_p99_ms=lat))


class Surrogate:
    """Predicted capacity of server configs for one endpoint and pool (see the module docstring)."""

    def __init__(self, endpoint: EndpointSpec, pool: Any, *, capacity: Any, efficiency: Efficiency | None = None,
                 seed: int = 0, workers: int = 1):
        from autoresearch_dagster.emulator.noise import NoiseSettings  # noqa: F401 -- fail early if missing

        if not getattr(pool, "path", None):
            raise ValueError("the surrogate needs a replay pool stored in a file")
        self.endpoint, self.pool = endpoint, pool
        # the interpolated crossing needs bracketing steps, not a fine bisection: a coarser search is as
        # good a model and several times cheaper
        self.capacity = replace(capacity, warmup_s=0.0, resolution=max(capacity.resolution, 0.1),
                                max_steps=min(capacity.max_steps, 10))
        self.efficiency = efficiency or Efficiency()
        self.seed, self.workers = seed, workers
        self.cache: dict[str, SurrogatePoint] = {}
        self.evaluations = 0
        self.calibration: dict[str, Any] | None = None

    @property
    def params(self) -> tuple[str, ...]:
        """The efficiency factors a calibration fits (``emulator.calibrate.endpoint_params``)."""
        from autoresearch_dagster.emulator.calibrate import endpoint_params

        return endpoint_params(self.endpoint)

    @property
    def model_id(self) -> str:
        """Identifies the model behind the predictions (factors, search settings, seed)."""
        blob = json.dumps([asdict(self.efficiency), asdict(self.capacity), self.seed], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def evaluate(self, configs: list[dict[str, Any]]) -> list[SurrogatePoint]:
        """Surrogate points for ``configs`` (cached; new ones measured on the worker processes)."""
        todo: dict[str, dict[str, Any]] = {}
        for c in configs:
            h = config_hash(c)
            if h not in self.cache and h not in todo:
                todo[h] = c
        if todo:
            args = []
            for h, c in todo.items():
                try:  # the emulator's view of the endpoint's engine (vLLM knobs -> the emulator's: engine_view)
                    view = emulator_view(self.endpoint, c)
                except SpecError as e:
                    self.cache[h] = SurrogatePoint(h, False, reason=f"not emulated: {e}"[:300])
                    continue
                args.append((view.endpoint.model_dump_json(), str(self.pool.path), view.config, self.efficiency,
                             self.capacity, self.seed, h))
            for d in map_calls(_evaluate, args, workers=self.workers):
                self.cache[d["config_hash"]] = SurrogatePoint(**d)
            self.evaluations += len(todo)
        return [self.cache[config_hash(c)] for c in configs]

    def calibrate(self, config: dict[str, Any], steps: list[dict[str, Any]], *, max_evals: int = 10) -> dict[str, Any]:
        """Fit the memory-bandwidth and GEMM/MoE efficiency to measured load steps of ``config`` (the
        baseline's noise run at its median), on median latencies of steps well below the knee; keeps
        the fit only if it lowers the error."""
        from autoresearch_dagster.emulator.calibrate import below_knee, curve_points

        points = curve_points(below_knee(steps, keep=3))
        if len(points) < 2:
            return {"fitted": False, "reason": "fewer than 2 measured steps well below the knee"}
        return self.fit(config, points, max_evals=max_evals)

    def fit(self, config: dict[str, Any], points: list[Any], *, max_evals: int = 10) -> dict[str, Any]:
        """Fit the memory-bandwidth and GEMM/MoE efficiency to ``points`` (CurvePoints, each may name its own
        config); keeps the fit only if it lowers the error."""
        from autoresearch_dagster.emulator.calibrate import calibrate

        res = calibrate(self.endpoint, config, self.pool, points, params=self.params,
                        start=self.efficiency,
                        metrics=(("ttft_ms", "p50"), ("tpot_ms", "p50"), ("itl_ms", "p50")), max_evals=max_evals,
                        request_timeout_s=self.capacity.request_timeout_s, prior_weight=CALIBRATION_PRIOR)
        before, after = float(np.mean(list(res.initial_error.values()))), float(np.mean(list(res.error.values())))
        fitted = res.success or after < before
        if fitted and after < before:
            self.efficiency = res.efficiency
            self.cache.clear()
        self.calibration = {"fitted": fitted and after < before, "params": res.params, "prior_weight": CALIBRATION_PRIOR,
                            "error_before": before,
                            "error_after": after, "points": len(points), "n_evals": res.n_evals,
                            "error_before_by_metric": res.initial_error, "error_after_by_metric": res.error,
                            "residuals": res.predictions, "success": res.success}
        return self.calibration


@dataclass
class Residual:
    knobs: tuple[str, ...]
    predicted: float  # surrogate ratio
    measured: float  # the verdict's median ratio


@dataclass
class Corrector:
    """Learns the surrogate's errors from this campaign's verdicts (see the module docstring)."""
    residuals: list[Residual] = field(default_factory=list)
    prior_sigma: float = 0.12  # log-ratio error before any verdict: about ±20% at 80%
    prior_weight: float = 2.0
    measurement_cv: float = 0.03

    def add(self, knobs: list[str], predicted: float, measured: float) -> None:
        if predicted > 0 and measured > 0:
            self.residuals.append(Residual(tuple(sorted(knobs)), float(predicted), float(measured)))

    def _weights(self, knobs: set[str]) -> np.ndarray:
        return np.array([len(knobs & set(r.knobs)) / max(1, len(knobs | set(r.knobs))) for r in self.residuals])

    def predict(self, knobs: list[str], surrogate_ratio: float, *, confidence: float = 0.8) -> tuple[float, float, float, str]:
        """(ratio, low, high, basis) for a candidate changing ``knobs`` whose surrogate ratio is given."""
        logs = np.array([math.log(r.measured / r.predicted) for r in self.residuals])
        if len(logs):
            w = self._weights(set(knobs)) + 0.25  # every verdict says something about the model as a whole
            bias = float(np.sum(w * logs) / (np.sum(w) + self.prior_weight))
            spread = float(np.sqrt((np.sum(w * (logs - bias) ** 2) + self.prior_weight * self.prior_sigma ** 2)
                                   / (np.sum(w) + self.prior_weight)))
        else:
            bias, spread = 0.0, self.prior_sigma
        meas = self.measurement_cv * 1.25 * math.sqrt(2 / 5)  # median of 5 runs per arm
        sigma = math.sqrt(spread ** 2 + meas ** 2)
        z = Z.get(round(confidence, 2), 1.2816)
        ratio = surrogate_ratio * math.exp(bias)
        basis = (f"emulator surrogate ratio {surrogate_ratio:.3f}"
                 + (f", corrected by {math.expm1(bias):+.1%} from {len(logs)} verdict(s) of this campaign"
                    if len(logs) else ", no verdict yet to correct it")
                 + f"; interval from a log-error spread of {sigma:.3f}")
        return ratio, ratio * math.exp(-z * sigma), ratio * math.exp(z * sigma), basis
