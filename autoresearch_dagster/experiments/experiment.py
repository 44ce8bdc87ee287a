"""Owns baseline-vs-candidate experiments: the correctness gate, staged runs, verdicts and confirmation.

Arms are interleaved ABAB..., every run gets its own seed and is recorded (valid or not); invalid
runs never count and are retried within a per-arm limit. Stages follow ``stats.run_schedule``;
verdict rules live in ``stats``.

Shared control (``SharedControl``): within a round the baseline does not change, so its arm can be
shared. The baseline arm then starts from runs measured before (the noise floor's repeats, earlier
experiments' baseline runs against the same baseline), and each stage adds only a few fresh baseline
"anchor" runs interleaved with the candidate's (one per ``anchor_every`` candidate runs, at least one),
which also check that the baseline has not drifted since: anchors whose median leaves the noise
floor's A/A band drop the earlier runs and the experiment continues with fresh interleaved arms.
With ``comparisons`` candidates sharing one control, the verdict interval's lower bound (what a
"better", hence a promotion, rests on) is widened to the Bonferroni level
``1 - (1 - DECISION_CONFIDENCE) / comparisons``, and so is the significance bound a "worse" rests on
(``stats.CORRECT_WORSE``: a false "worse" claims a difference, which memory keeps); the interval's upper bound, which a
"same" needs inside the margin, stays at ``DECISION_CONFIDENCE`` (``stats.verdict``'s ``upper_confidence``).

On an autoscaled endpoint, beside the capacity verdict, the runs that replayed the production demand
curve give the candidate's GPU-seconds against the baseline's on that demand (``gpu_savings``: ratio
with its interval across runs, mean GPUs saved).
"""
from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from autoresearch_dagster.engines.base import DRIFT_PREFIX, Deployment, Engine, EngineError
from autoresearch_dagster.experiments import gpu_savings, stats
from autoresearch_dagster.experiments.campaign import Campaign, config_rows
from autoresearch_dagster.experiments.parallel import RunTask, run_many
from autoresearch_dagster.experiments.runs import (INTERP_METRIC, HarnessSettings, Progress, RunRecord, capacity_metric,
                                                   estimator_name, plain, record_run)
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import Budget, EndpointSpec, config_hash, is_lossy

Arm = Literal["baseline", "candidate"]
# from this many baseline runs on, a comparison's margin takes the run CV from them rather than the noise floor's runs
POOLED_CV_RUNS = 10


@dataclass
class ExperimentResult:
    experiment_id: str
    endpoint: str
    campaign_id: str | None
    kind: str
    parent_id: str | None
    mode: str
    metric: str
    baseline_config: dict[str, Any]
    candidate_config: dict[str, Any]
    lossy: bool
    verdict: str = "invalid"  # better | same | worse | invalid
    confirmed: bool = False
    reason: str = ""
    stats: stats.Verdict | None = None  # the verdict the decision rests on
    stages: list[dict[str, Any]] = field(default_factory=list)  # every verdict computed, in order
    noise_cv: float | None = None
    noise_source: str = ""
    correctness: dict[str, Any] | None = None
    invalid_reasons: list[str] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""
    estimator: str = ""  # HarnessSettings.estimator: which per-run capacity ``metric`` selected
    shared_runs: list[RunRecord] = field(default_factory=list)  # the shared control's earlier baseline runs
    comparisons: int = 1  # candidates sharing the control (Bonferroni factor of the verdict interval)
    control_note: str = ""  # what happened to the shared control (drift)
    gpu_savings: dict[str, Any] | None = None  # GPUs saved under the real demand curve (module doc)

    @property
    def baseline_hash(self) -> str:
        return config_hash(self.baseline_config)

    @property
    def candidate_hash(self) -> str:
        return config_hash(self.candidate_config)

    def values(self, arm: str, purposes: tuple[str, ...] = ("experiment", "confirmation"),
               metric: str | None = None) -> list[float]:
        """The valid runs' values of ``metric`` (default: the verdict's) in one arm."""
        metric = metric or self.metric
        shared = self.shared_runs if arm == "baseline" and "experiment" in purposes else []
        return [float(r.value(metric)) for r in shared + self.runs
                if r.arm == arm and r.valid and (r in shared or r.purpose in purposes) and r.value(metric) is not None]

    @property
    def gpu_seconds(self) -> float:
        """GPU time this experiment measured (the shared control's earlier runs were paid for before)."""
        return float(sum(r.gpu_seconds for r in self.runs))

    @property
    def runs_baseline(self) -> int:
        return len(self.values("baseline"))

    @property
    def runs_candidate(self) -> int:
        return len(self.values("candidate"))

    def to_dict(self) -> dict:
        v = self.stats
        return {"experiment_id": self.experiment_id, "endpoint": self.endpoint, "campaign_id": self.campaign_id,
                "kind": self.kind, "parent_id": self.parent_id, "verdict": self.verdict, "confirmed": self.confirmed,
                "reason": self.reason, "metric": self.metric, "mode": self.mode,
                "ratio_median": v.ratio_median if v else None, "ci_low": v.ci_low if v else None,
                "ci_high": v.ci_high if v else None, "margin": v.margin if v else None,
                "confidence": v.confidence if v else None,
                "noise_cv": self.noise_cv, "noise_source": self.noise_source,
                "runs_baseline": self.runs_baseline, "runs_candidate": self.runs_candidate,
                "capacities_baseline": self.values("baseline"), "capacities_candidate": self.values("candidate"),
                "lossy": self.lossy, "correctness": self.correctness, "invalid_reasons": self.invalid_reasons,
                "baseline_config": self.baseline_config, "candidate_config": self.candidate_config,
                "baseline_hash": self.baseline_hash, "candidate_hash": self.candidate_hash,
                "stages": self.stages, "run_order": [f"{r.arm[0].upper()}:{r.purpose}" for r in self.runs],
                "runs": [r.to_dict() for r in self.runs], "estimator": self.estimator,
                "shared_control_run_ids": [r.run_id for r in self.shared_runs], "comparisons": self.comparisons,
                "control_note": self.control_note, "gpu_seconds": self.gpu_seconds,
                "gpu_savings": self.gpu_savings, "started_at": self.started_at, "finished_at": self.finished_at}

    def summary(self) -> dict:
        """The verdict with its evidence, without the per-run details: what CLI and assets report."""
        return {k: v for k, v in self.to_dict().items() if k != "runs"}

    def lake_rows(self) -> dict[str, list[dict]]:
        """The finished experiment's row in ``experiments`` (its runs and verdicts are recorded as they happen)."""
        v, g = self.stats, self.gpu_savings or {}
        return {"experiments": [{
            "experiment_id": self.experiment_id, "campaign_id": self.campaign_id, "kind": self.kind,
            "parent_id": self.parent_id, "mode": self.mode, "baseline_hash": self.baseline_hash,
            "candidate_hash": self.candidate_hash, "candidate_json": json.dumps(self.candidate_config, sort_keys=True),
            "lossy": self.lossy, "verdict": self.verdict, "confirmed": self.confirmed,
            "ratio_median": v.ratio_median if v else None, "ci_low": v.ci_low if v else None,
            "ci_high": v.ci_high if v else None, "margin": v.margin if v else None, "noise_cv": self.noise_cv,
            "runs_baseline": self.runs_baseline, "runs_candidate": self.runs_candidate,
            "invalid_reasons": self.invalid_reasons,
            "correctness_json": json.dumps(self.correctness, sort_keys=True, default=str) if self.correctness else None,
            "reason": self.reason, "started_at": dt.datetime.fromisoformat(self.started_at),
            "finished_at": dt.datetime.fromisoformat(self.finished_at), "gpu_seconds": self.gpu_seconds,
            "shared_control_runs": len(self.shared_runs), "comparisons": self.comparisons,
            "demand_gpu_seconds_ratio": g.get("gpu_seconds_ratio"), "demand_gpu_seconds_ratio_ci_low": g.get("ci_low"),
            "demand_gpu_seconds_ratio_ci_high": g.get("ci_high"), "demand_mean_gpus_saved": g.get("mean_gpus_saved")}]}


def verdict_rows(experiment_id: str, stage: str, metric: str, v: stats.Verdict) -> dict[str, list[dict]]:
    """One computed verdict's row in ``verdicts`` (every stage, confirmation and stop of an experiment)."""
    return {"verdicts": [{
        "verdict_id": f"v-{uuid.uuid4().hex[:12]}", "experiment_id": experiment_id, "stage": stage, "metric": metric,
        **{k: getattr(v, k) for k in ("verdict", "ratio_median", "ci_low", "ci_high", "margin", "noise_cv",
                                      "n_baseline", "n_candidate", "p_value", "equivalence_shown", "underpowered",
                                      "reason", "ci_method")},
        "baseline_values": v.baseline, "candidate_values": v.candidate, "decided_at": utc_now()}]}


def already_tested(results: Any, endpoint: str, baseline_hash: str, *, since: dt.datetime | None = None) -> set[str]:
    """Config hashes of the candidates already tested against this baseline, from the lake's ``experiments``;
    with ``since``, only experiments started at or after it (the baseline was set then: a re-seeded or
    promoted baseline starts its rounds afresh, while the lake keeps every earlier row)."""
    return {row["candidate_hash"] for row in results.read("experiments", endpoint=endpoint)
            if row.get("baseline_hash") == baseline_hash
            and (since is None or (row.get("started_at") is not None and row["started_at"] >= since))}


def correctness_check(endpoint: EndpointSpec, baseline: dict[str, Any], candidate: dict[str, Any], pool: Any, *,
                      engine: Engine, seed: int = 0, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The output-distribution gate for a lossy candidate; any failure to run it counts as not passed."""
    options = dict(options or {})
    try:
        from autoresearch_dagster import correctness
    except ImportError as e:
        return {"passed": False, "error": f"correctness gate unavailable: {e}"}
    deps: list[Deployment] = []
    try:
        if getattr(engine, "name", "") == "emulator":
            res = correctness.emulated_gate(baseline, candidate, seed=seed, **options)
        else:
            deps.append(engine.deploy(baseline, seed=seed))
            deps.append(engine.deploy(candidate, seed=seed + 1))
            # the name the server answers to (a vLLM endpoint's served_model_name), else the endpoint's model
            served = getattr(deps[0], "served_model", None)
            options.setdefault("model", served() if callable(served) else endpoint.model)
            res = correctness.gate(deps[0].base_url, deps[1].base_url, options.pop("prompts", None), **options)
    except Exception as e:  # noqa: BLE001 -- a gate that cannot run does not pass
        return {"passed": False, "error": f"correctness gate failed to run: {type(e).__name__}: {e}"[:500]}
    finally:
        for d in deps:
            try:
                d.close()
            except Exception:  # noqa: BLE001 -- closing is best effort once the gate has its answer
                pass
    out = plain(res)
    return out if isinstance(out, dict) else {"passed": bool(getattr(res, "passed", False)), "result": str(res)}


class RunSource(Protocol):
    """Where an experiment's runs come from when they are not measured on the spot."""

    def __call__(self, arm: str, config: dict[str, Any], *, purpose: str, mode: str, run_index: int,
                 seed: int, capacity_start: float | None = None) -> "RunRecord": ...


@dataclass
class SharedControl:
    """Baseline runs measured before an experiment that its baseline arm starts from (see the module doc)."""
    runs: list[RunRecord]
    anchor_every: int = 1  # one fresh baseline run per this many candidate runs of a stage (at least one)

    def anchors(self, candidate_runs: int) -> int:
        return max(1, math.ceil(candidate_runs / max(1, self.anchor_every)))


class _Experiment:
    """Mutable state of one running experiment: the run counter, seeds, lake writes."""

    def __init__(self, endpoint: EndpointSpec, pool: Any, engine: Engine, results: Any, settings: HarnessSettings,
                 res: ExperimentResult, deadline: float | None, progress: Progress, run_source: "RunSource | None",
                 control: SharedControl | None = None):
        self.endpoint, self.pool, self.engine, self.results = endpoint, pool, engine, results
        self.settings, self.res, self.deadline, self.progress = settings, res, deadline, progress
        self.run_source = run_source
        self.control = control
        self.confidence = 1.0 - (1.0 - stats.DECISION_CONFIDENCE) / max(1, res.comparisons)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def shared(self) -> bool:
        return bool(self.res.shared_runs)

    @property
    def warm(self) -> bool:
        """Whether runs start their searches at their arm's estimate: under a shared control only (the classic
        procedure keeps cold, strictly interleaved runs), capacity mode, ``settings.warm_start``."""
        return self.settings.warm_start and self.shared and self.res.mode != "shape"

    def capacity_start(self, arm: Arm) -> float | None:
        """Where this arm's next capacity search starts under a shared control (``runs.warm_started``): the median
        capacity of its valid runs so far (the control's among them), or None (a cold search) before it has any.

        Each arm starts at its own estimate, never at the other's: near the knee the SLA ratio moves little with
        rate and much from step to step, so an estimate leans toward where its probes were. On the demo (40 runs
        per start, same seeds) a search started 10% below a deployment's capacity read 3.5% lower than one started
        10% above it; starting a +10% candidate at the baseline's capacity shrank its measured gain by a quarter.
        Started at their own estimates, both arms lean alike and the ratio keeps the effect."""
        if not self.warm:
            return None
        runs = list(self.res.runs) + (list(self.res.shared_runs) if arm == "baseline" else [])
        known = [x for x in (r.value(self.res.metric) for r in runs if r.arm == arm and r.valid) if x]
        return float(np.median(known)) if known else None

    def _task(self, arm: Arm, purpose: str, mode: str, index: int) -> RunTask:
        config = self.res.baseline_config if arm == "baseline" else self.res.candidate_config
        return RunTask(config=config, arm=arm, run_index=index, seed=self.settings.seed * 1_000_003 + index + 1,
                       purpose=purpose, mode=mode, capacity_start=self.capacity_start(arm))

    def _store(self, rec: RunRecord) -> None:
        self.res.runs.append(rec)
        record_run(self.results, self.endpoint.name, rec, experiment_id=self.res.experiment_id,
                   campaign_id=self.res.campaign_id, gpus=self.endpoint.gpus)
        if self.progress:
            val = rec.value(self.res.metric)
            self.progress(f"  run {rec.run_index + 1} {rec.arm:9s} {rec.purpose:12s} seed={rec.seed} "
                          f"{self.res.metric}={'-' if val is None else f'{val:.4g}'}"
                          + ("" if rec.valid else f" INVALID: {'; '.join(rec.invalid_reasons)}"))

    def run_batch(self, arms: list[Arm], purpose: str, mode: str) -> None:
        """Measure one run per entry of ``arms`` (in that order, seeds by position), in parallel where the
        engine allows (``HarnessSettings.parallel_runs``). Run one at a time, the batch stops at the first
        run past the budget or that makes the experiment invalid; in parallel it is checked per batch."""
        start = len(self.res.runs)
        tasks = [self._task(arm, purpose, mode, start + i) for i, arm in enumerate(arms)]
        if self.run_source is not None:
            for t in tasks:
                if self.stopped():
                    return
                self._store(self.run_source(t.arm, t.config, purpose=purpose, mode=mode, run_index=t.run_index,
                                            seed=t.seed, capacity_start=t.capacity_start))
            return
        run_many(self.endpoint, self.pool, tasks, engine=self.engine, settings=self.settings,
                 workers=self.settings.parallel_runs, on_done=self._store, should_stop=self.stopped)

    def stopped(self) -> bool:
        """No further run of this batch: out of time, or the experiment is already invalid."""
        return self.out_of_time() or bool(self.fatal())

    def run(self, arm: Arm, purpose: str, mode: str) -> RunRecord:
        self.run_batch([arm], purpose, mode)
        return self.res.runs[-1]

    def fatal(self) -> list[str]:
        """Reasons that make the whole experiment invalid (drift is deterministic; too many invalid runs)."""
        out = sorted({x for r in self.res.runs for x in r.invalid_reasons if x.startswith(DRIFT_PREFIX)})
        for arm in ("baseline", "candidate"):
            bad = [r for r in self.res.runs if r.arm == arm and not r.valid]
            if len(bad) > self.settings.max_invalid_per_arm:
                reasons = sorted({x for r in bad for x in r.invalid_reasons})
                out.append(f"{arm}: {len(bad)} invalid runs (limit {self.settings.max_invalid_per_arm}): "
                           + "; ".join(reasons))
        return out

    def valid_counts(self, purpose: str) -> dict[str, int]:
        """Valid runs of this purpose per arm, measured in this experiment."""
        return {a: sum(1 for r in self.res.runs if r.arm == a and r.valid and r.purpose == purpose)
                for a in ("baseline", "candidate")}

    def targets(self, candidate_runs: int) -> dict[str, int]:
        """Runs per arm a stage of ``candidate_runs`` needs: equal arms, or anchors beside a shared control."""
        base = self.control.anchors(candidate_runs) if self.shared and self.control else candidate_runs
        return {"baseline": base, "candidate": candidate_runs}

    def fill(self, targets: dict[str, int] | int, purpose: str, mode: str) -> str | None:
        """Run ABAB batches until each arm has its target of valid runs of this purpose; returns why it
        stopped early. Interleaving pairs a baseline with each candidate run while both need runs."""
        if isinstance(targets, int):
            targets = {"baseline": targets, "candidate": targets}
        while True:
            have = self.valid_counts(purpose)
            need = {a: max(0, targets[a] - have[a]) for a in ("baseline", "candidate")}
            if not any(need.values()):
                return None
            if self.out_of_time():
                return "wall-time budget exhausted"
            if need["candidate"] > 1 and self.warm and self.capacity_start("candidate") is None:
                need["candidate"] = 1  # the candidate's first run alone: the others start at its capacity
            arms: list[Arm] = []
            while need["baseline"] or need["candidate"]:
                for arm in ("baseline", "candidate"):
                    if need[arm]:
                        arms.append(arm)
                        need[arm] -= 1
            self.run_batch(arms, purpose, mode)
            if self.fatal():
                return "invalid"

    def check_drift(self) -> None:
        """Drop the shared control when the fresh anchors' median left the A/A band around it."""
        if not self.shared:
            return
        anchors = [float(r.value(self.res.metric)) for r in self.res.runs
                   if r.arm == "baseline" and r.valid and r.value(self.res.metric) is not None]
        earlier = [float(r.value(self.res.metric)) for r in self.res.shared_runs
                   if r.valid and r.value(self.res.metric) is not None]
        if len(anchors) < 2 or len(earlier) < 2:
            return
        cv = self.res.noise_cv if self.res.noise_cv is not None else stats.noise_floor(earlier).cv
        band = stats.aa_noise_floor(cv, len(earlier), len(anchors), quantile=0.99)
        ratio = float(np.median(anchors) / np.median(earlier))
        if abs(ratio - 1) > max(band, self.settings.min_margin):
            self.res.control_note = (f"shared control dropped: the fresh baseline anchors' median is {ratio:.4f}x the "
                                     f"earlier runs' (outside the 99% A/A band ±{band:.4f}); the baseline drifted, "
                                     "so the arms continue with fresh interleaved runs only")
            if self.progress:
                self.progress("  " + self.res.control_note)
            self.res.shared_runs = []

    def verdict(self, stage: str, purposes: tuple[str, ...] = ("experiment", "confirmation"),
                metric: str | None = None) -> stats.Verdict | None:
        metric = metric or self.res.metric
        b, c = (self.res.values(arm, purposes, metric) for arm in ("baseline", "candidate"))
        if len(b) < 2 or len(c) < 2 or float(np.median(b)) <= 0:
            return None
        if self.res.noise_source != "noise_baseline" and metric == self.res.metric:
            self.res.noise_cv = stats.noise_floor(b, seed=self.settings.seed).cv
            self.res.noise_source = "this experiment's baseline runs"
        cv = self.res.noise_cv or 0.0
        if self.res.noise_source == "noise_baseline" and len(b) >= POOLED_CV_RUNS and metric == self.res.metric:
            # the baseline arm's own runs (the noise floor's among them under a shared control) estimate the run
            # CV better than the noise floor's 5 alone: the margin's noise floor then stops swinging with them
            cv = stats.run_cv(b)
        v = stats.verdict(b, c, noise_cv=cv, min_margin=self.settings.min_margin,
                          seed=self.settings.seed, confidence=self.confidence,
                          upper_confidence=stats.DECISION_CONFIDENCE)
        self.record(stage, metric, v)
        return v

    def record(self, stage: str, metric: str, v: stats.Verdict) -> None:
        fallback = sum(1 for r in self.res.runs if r.valid and r.capacity_interp_rps is None) \
            if metric == INTERP_METRIC else 0
        self.res.stages.append({"stage": stage, "metric": metric, "estimator": estimator_name(metric),
                                "runs_on_search_fallback": fallback, "shared_control_runs": len(self.res.shared_runs),
                                **v.to_dict()})
        if self.progress:
            self.progress(f"  verdict [{stage}] {v.verdict}: ratio={v.ratio_median:.4f} CI=[{v.ci_low:.4f}, "
                          f"{v.ci_high:.4f}] margin={v.margin:.4f} n={v.n_baseline}/{v.n_candidate}")
        if self.results is not None:
            self.results.append_rows(verdict_rows(self.res.experiment_id, stage, metric, v),
                                     endpoint=self.endpoint.name)


def run_experiment(endpoint: EndpointSpec, baseline_config: dict[str, Any], candidate_config: dict[str, Any],
                   pool: Any, *, engine: Engine, results: Any = None, settings: HarnessSettings | None = None,
                   budget: Budget | None = None, noise_cv: float | None = None, campaign: Campaign | None = None,
                   experiment_id: str | None = None, kind: str = "single", parent_id: str | None = None,
                   progress: Progress = None, run_source: "RunSource | None" = None,
                   control: SharedControl | None = None, comparisons: int = 1,
                   correctness: dict[str, Any] | None = None) -> ExperimentResult:
    """Baseline vs candidate on the campaign's pool and SLA, to a verdict with its evidence.

    Lossy candidates pass the correctness gate first. Runs interleave ABAB with fresh deployments;
    stages of 5 -> 10 -> 20 valid runs per arm (from ``budget``) until the verdict is decided; an
    undecided verdict at the cap or when the wall-time budget ends becomes "same" with the reason.
    A "better" is confirmed on fresh runs (plus the production-shape replay in mode "both").
    ``noise_cv`` comes from ``measure_noise``; without it the baseline runs here estimate it.
    ``run_source`` replaces fresh deployments with runs measured earlier by ``execute_run`` (the
    statistical benchmark draws from banks of emulator runs); None measures every run now.
    ``control`` shares earlier baseline runs (module doc); ``comparisons`` is the number of candidates
    sharing them (the verdict interval's Bonferroni factor). ``correctness`` is a gate result already
    known for this baseline/candidate pair (the campaign caches them), so the gate does not run again.
    """
    settings = settings or HarnessSettings()
    mode = settings.mode or endpoint.workload.mode
    if not getattr(engine, "restartable", True):
        raise EngineError(f"engine {getattr(engine, 'name', engine)!r} cannot restart with a new config: "
                          "it measures baselines only")
    schedule = stats.run_schedule(budget)
    deadline = time.monotonic() + budget.max_wall_s if budget and budget.max_wall_s is not None else None
    baseline_config, candidate_config = dict(baseline_config), dict(candidate_config)
    res = ExperimentResult(experiment_id=experiment_id or f"e-{uuid.uuid4().hex[:12]}", endpoint=endpoint.name,
                           campaign_id=campaign.campaign_id if campaign else None, kind=kind, parent_id=parent_id,
                           mode=mode, metric="replay_capacity" if mode == "shape" else capacity_metric(settings),
                           baseline_config=baseline_config, candidate_config=candidate_config,
                           lossy=is_lossy(candidate_config, baseline_config, endpoint.engine), started_at=utc_now().isoformat(),
                           noise_cv=noise_cv, noise_source="noise_baseline" if noise_cv is not None else "",
                           estimator=settings.estimator, comparisons=max(1, int(comparisons)),
                           shared_runs=[r for r in (control.runs if control else []) if r.valid])
    if results is not None:
        results.append_rows(config_rows(candidate_config, source=f"candidate:{res.experiment_id}",
                                        baseline=baseline_config, engine=endpoint.engine), endpoint=endpoint.name)
    ex = _Experiment(endpoint, pool, engine, results, settings, res, deadline, progress, run_source, control)
    warm_from = ex.capacity_start("baseline")
    if progress:
        progress(f"experiment {res.experiment_id}: {res.baseline_hash} vs {res.candidate_hash} "
                 f"(mode {mode}, lossy={res.lossy}, stages {schedule}"
                 + (f", shared control of {len(res.shared_runs)} runs, {res.comparisons} comparisons" if ex.shared
                    else "")
                 + (f"; baseline searches start at {warm_from:.4g} req/s, the candidate's at its first run's "
                    "capacity" if warm_from else "") + ")")
    if res.lossy:
        res.correctness = correctness if correctness is not None else correctness_check(
            endpoint, baseline_config, candidate_config, pool, engine=engine, seed=settings.seed,
            options=settings.gate_options)
        if progress:
            progress(f"  correctness gate: passed={res.correctness.get('passed')}")
        if not res.correctness.get("passed"):
            res.invalid_reasons.append("correctness gate failed: "
                                       + "; ".join([str(res.correctness["error"])] if res.correctness.get("error")
                                                   else [str(x) for x in res.correctness.get("reasons") or []]
                                                   or ["no reason given"]))
            return _finish(ex, "invalid", "the candidate changes the model's outputs beyond the calibrated threshold")
    run_mode = "capacity" if mode == "both" else mode
    v: stats.Verdict | None = None
    stop = None
    for target in schedule:
        more = stats.next_stage(target, schedule)  # None at the cap
        stop = ex.fill(ex.targets(target), "experiment", run_mode)
        if stop == "invalid":
            res.invalid_reasons += ex.fatal()
            return _finish(ex, "invalid", "runs cannot support a comparison")
        shared_before = ex.shared
        ex.check_drift()
        if shared_before and not ex.shared:  # the control drifted: redo this stage with equal fresh arms
            stop = ex.fill(ex.targets(target), "experiment", run_mode)
            if stop == "invalid":
                res.invalid_reasons += ex.fatal()
                return _finish(ex, "invalid", "runs cannot support a comparison")
        v = ex.verdict(f"n={target}")
        if stop or v is None:
            break
        if v.verdict == "better" and settings.confirm and more:
            # confirm now; a "better" that does not repeat is not the end of the experiment before the
            # cap: the runs so far (confirmation runs included) stay in the evidence and the next stage adds more
            outcome = _confirm(ex, schedule[0], mode, want="better")
            if outcome.verdict != "undecided":
                return _close(ex, outcome)
            if ex.progress:
                ex.progress(f"  {outcome.reason}; continuing to n={more} per arm")
            continue
        if settings.stop_when_not_better and more and stats.not_better(v, min_margin=settings.min_margin):
            v = stats.stop_not_better(v)
            ex.record("futility", res.metric, v)
            break
        if v.verdict == "same" and v.margin > settings.min_margin and more:
            # an equivalence shown only within a noise-inflated margin is not "same" at the practical
            # margin: a true -5% change read as "same within ±7%" after 5 runs; more runs shrink the floor
            if ex.progress:
                ex.progress(f"  same only within ±{v.margin:.4f} (noise floor above the {settings.min_margin:.0%} "
                            f"practical margin); continuing to n={more} per arm")
            continue
        if v.verdict != "undecided":
            break
    if v is None:
        res.invalid_reasons.append(f"fewer than 2 valid runs per arm ({stop or 'no valid runs'})")
        return _finish(ex, "invalid", "not enough valid runs")
    if v.verdict == "undecided":
        promising = abs(v.ratio_median - 1) >= v.margin
        if promising and settings.confirm and not stop:
            return _close(ex, _confirm(ex, schedule[0], mode, want="better" if v.ratio_median > 1 else "worse"),
                          final=True)
        extension = stats.extension_schedule(schedule)
        if extension and not settings.confirm and not stop and stats.worth_extending(v, extension[-1],
                                                                                       min_margin=settings.min_margin):
            # without a confirmation stage (a shared control's "better" is replicated by the promoted config's
            # own noise floor), a comparison undecided at the cap gets runs in small steps, up to twice the cap,
            # while a decision stays within reach (stats.worth_extending)
            for ext in extension:
                stop = ex.fill(ex.targets(ext), "experiment", run_mode)
                if stop == "invalid":
                    res.invalid_reasons += ex.fatal()
                    return _finish(ex, "invalid", "runs cannot support a comparison")
                ex.check_drift()
                v = ex.verdict(f"n={ext} (extension: a decision within reach at the run cap)") or v
                if stop or v.verdict != "undecided" or not stats.worth_extending(v, extension[-1],
                                                                                 min_margin=settings.min_margin):
                    break
        if v.verdict == "undecided":
            v = stats.stop_undecided(v, stop or f"run cap of {v.n_candidate} per arm reached")
            ex.record("stopped", res.metric, v)
    res.stats = v
    if v.verdict != "better" or not settings.confirm:
        return _finish(ex, v.verdict, v.reason, confirmed=False)
    return _close(ex, _confirm(ex, schedule[0], mode, want="better"), final=True)


@dataclass
class _Outcome:
    """What a confirmation concluded: the verdict (``undecided`` = not confirmed, more runs may decide),
    its reason and the verdict over all runs."""
    verdict: str
    reason: str
    pooled: stats.Verdict | None
    confirmed: bool = False
    invalid: bool = False


def _close(ex: _Experiment, out: _Outcome, *, final: bool = False) -> ExperimentResult:
    """Finish the experiment with a confirmation's outcome; at the end of the schedule an unconfirmed
    ("undecided") outcome becomes "same" with the reason, recorded as the stopping verdict."""
    res = ex.res
    if out.invalid:
        return _finish(ex, "invalid", out.reason)
    v = out.pooled
    if out.verdict == "undecided":
        if not final:
            raise ValueError("an unconfirmed outcome closes the experiment only at the end of the schedule")
        v = stats.stop_undecided(stats.Verdict(**{**v.to_dict(), "verdict": "undecided"}), out.reason)
        ex.record("stopped", res.metric, v)
        res.stats = v
        return _finish(ex, "same", out.reason)
    res.stats = v
    return _finish(ex, out.verdict, out.reason, confirmed=out.confirmed)


def _confirm(ex: _Experiment, n: int, mode: str, *, want: str) -> _Outcome:
    """Promising results count only if they repeat on fresh runs and the pooled evidence still decides for them.

    Promising = a "better" at any stage, or an undecided comparison at the run cap whose point estimate
    lies beyond the margin (in either direction). ``n`` fresh runs per arm are added (ABAB, new seeds)
    on top of any earlier confirmation runs; the fresh runs alone must point the same way, the verdict
    over all runs must be ``want``, and in mode "both" the production-shape replay of the fresh runs
    must not be worse. Returns ``want`` when confirmed, "undecided" when not (with why), or the pooled
    verdict when the evidence now decides against ``want``.
    """
    res = ex.res
    earlier = {r.run_id for r in res.runs if r.purpose == "confirmation"}
    have = ex.valid_counts("confirmation")
    more = ex.targets(n)
    stop = ex.fill({a: have[a] + more[a] for a in have}, "confirmation",
                   mode if want == "better" else ("shape" if mode == "shape" else "capacity"))
    if stop == "invalid":
        res.invalid_reasons += ex.fatal()
        return _Outcome("invalid", "confirmation runs cannot support a comparison", None, invalid=True)
    fresh = {arm: [float(r.value(res.metric)) for r in res.runs if r.arm == arm and r.valid
                   and r.purpose == "confirmation" and r.run_id not in earlier and r.value(res.metric) is not None]
             for arm in ("baseline", "candidate")}
    pooled = ex.verdict("confirmation: pooled")
    problems = [stop] if stop else []
    if not fresh["baseline"] or not fresh["candidate"]:
        problems.append("no valid confirmation runs")
    else:
        fresh_ratio = float(np.median(fresh["candidate"]) / np.median(fresh["baseline"]))
        if (fresh_ratio <= 1) if want == "better" else (fresh_ratio >= 1):
            problems.append(f"fresh runs do not repeat the direction (ratio {fresh_ratio:.4f})")
    if pooled is None or pooled.verdict != want:
        problems.append(f"verdict over all runs is {pooled.verdict if pooled else 'unavailable'}")
    if mode == "both" and want == "better":
        shape = ex.verdict("confirmation: production shape", purposes=("confirmation",), metric="replay_capacity")
        if shape is None:
            problems.append("no production-shape replay results")
        elif shape.verdict == "worse" or shape.ratio_median <= 1:
            problems.append(f"production-shape replay does not confirm (ratio {shape.ratio_median:.4f}, {shape.verdict})")
    if pooled is None:
        res.invalid_reasons.append("fewer than 2 valid runs per arm after confirmation")
        return _Outcome("invalid", "not enough valid runs", None, invalid=True)
    if not problems:
        return _Outcome(want, f"confirmed on {len(fresh['candidate'])} fresh candidate and {len(fresh['baseline'])} fresh "
                              f"baseline runs; {pooled.reason}", pooled, confirmed=True)
    why = f"{want} not confirmed: " + "; ".join(problems)
    if pooled.verdict in (want, "undecided"):
        return _Outcome("undecided", why, pooled)
    return _Outcome(pooled.verdict, f"{pooled.reason} ({why})", pooled)


def _finish(ex: _Experiment, verdict: str, reason: str, *, confirmed: bool = False) -> ExperimentResult:
    res = ex.res
    res.verdict, res.reason, res.confirmed = verdict, reason, confirmed
    res.finished_at = utc_now().isoformat()
    res.gpu_savings = gpu_savings.from_runs(res.runs, seed=ex.settings.seed)
    if ex.progress:
        ex.progress(f"experiment {res.experiment_id}: {verdict.upper()} ({reason})")
        if res.gpu_savings:
            ex.progress(f"  {gpu_savings.LABEL}: {gpu_savings.format_line(res.gpu_savings)}")
    if ex.results is not None:
        ex.results.append_rows(res.lake_rows(), endpoint=res.endpoint)
    return res
