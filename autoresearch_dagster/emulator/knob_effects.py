"""Owns the knob-effect validation: published runs of one setup with one serving flag changed, against the emulator.

A campaign's pre-screen asks the emulator how much a config change moves an endpoint, not what the endpoint does
in absolute terms (a calibration on the endpoint's own load curve takes care of that). This module checks that use
against public measurements: each pair in ``benchmarks/data/knob_effects.json`` is one setup (engine and version,
model, GPU, TP, dtypes, benchmark traffic) run twice by the same person, differing in one flag, with both results
printed. Its configs are written in the emulator's knob names (``spec.KNOBS``; vLLM flags as the SGLang knob the
emulator reads them as, as in ``validation``: ``max_num_seqs`` -> ``max_running_requests``, ``max_num_batched_tokens``
-> ``chunked_prefill_size``, prefix caching off -> ``disable_radix_cache``, ``enforce_eager`` ->
``disable_cuda_graph``, ``gpu_memory_utilization`` -> ``mem_fraction_static``).

For every metric both runs printed (``validation.METRICS``) the published ratio candidate / baseline is set against
the emulator's: with the default factors, and after calibrating on the baseline run (``validation.calibrate_on``),
which is the campaign's order of things: measure the baseline, calibrate, pre-screen the candidate. A throughput
at a finite request rate is the offered rate unless the server saturates, so throughput metrics count only for
offline and closed-loop runs. A published change within ``NOISE`` is a "no change" for the direction check.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from autoresearch_dagster.emulator.validation import METRICS, Point, Workload, calibrate_on, read_table, run_point
from autoresearch_dagster.spec import SpecError, validate_server_config

NOISE = 0.05  # published changes within +-5% count as "no change" (run-to-run spread of one setup)
THROUGHPUT = ("output_throughput", "total_token_throughput")
PRIMARY = ("output_throughput", "total_token_throughput", "median_tpot_ms", "median_itl_ms", "median_ttft_ms")


@dataclass(frozen=True)
class KnobPair:
    """One published setup run twice: ``baseline`` and ``candidate`` are Points with the same model, GPU, engine and
    traffic, differing in ``config`` (and in TP or KV dtype where that is the change; each side's own successful
    requests and printed totals); their ``value`` is the primary metric's, ``metrics``' first."""
    id: str
    change: str
    baseline: Point
    candidate: Point
    published: dict[str, tuple[float, float]]  # metric -> (baseline, candidate), as printed

    @property
    def round(self) -> int:
        return self.baseline.round

    @property
    def metrics(self) -> list[str]:
        """The metrics this pair is scored on, primary first."""
        ok = [m for m in PRIMARY if m in self.published]
        if self.baseline.workload.kind == "rate":
            ok = [m for m in ok if m not in THROUGHPUT]
        return ok


def _config(d: Any, where: str) -> dict[str, Any]:
    """A side's config in the emulator's knob names (``spec.validate_server_config``), the pair named on an error."""
    if not isinstance(d, dict):
        raise SpecError(f"{where}: config must be a mapping of knob -> value")
    try:
        return validate_server_config(d)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def _pair(d: dict[str, Any], where: str) -> KnobPair:
    try:
        w = Workload(**d["workload"])
        common = dict(source=d["source"], url=d["url"], source_quote=tuple(d["source_quote"]), engine=d["engine"],
                      engine_version=str(d["engine_version"]), model=d["model"], gpu=d["gpu"], tp=int(d["tp"]),
                      weights=d["weights"], kv_dtype=d["kv_dtype"], workload=w, unit="", split="holdout",
                      added=d.get("added"), round=int(d.get("round", 1)), note=d.get("note"))
        sides, own = {}, {}
        for side in ("baseline", "candidate"):
            s = d[side]
            sides[side] = (_config(s.get("config", {}), f"{where}: pair {d['id']!r} {side}"),
                           {k: float(v) for k, v in s["values"].items()})
            # what one run has of its own: its TP and KV dtype (a TP or KV change), the requests that succeeded
            # and the totals it printed
            own[side] = {k: s[k] for k in ("tp", "kv_dtype") if k in s}
            load = {k: s[k] for k in ("num_prompts", "total_input_tokens", "total_output_tokens") if k in s}
            if load:
                own[side]["workload"] = replace(w, **load)
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(f"{where}: knob pair {d.get('id', '?')!r} is malformed: {e}") from None
    published = {m: (sides["baseline"][1][m], sides["candidate"][1][m]) for m in METRICS
                 if m in sides["baseline"][1] and m in sides["candidate"][1]}
    if not published:
        raise SpecError(f"{where}: knob pair {d['id']!r} has no metric printed for both runs ({', '.join(METRICS)})")
    if not d["source_quote"] or not str(d["url"]).startswith("https://"):
        raise SpecError(f"{where}: knob pair {d['id']!r} needs a source URL and the source's own lines")
    first = next(m for m in PRIMARY if m in published)
    base = Point(**{**common, **own["baseline"]}, id=f"{d['id']}:baseline", config=sides["baseline"][0], metric=first,
                 value=published[first][0])
    cand = Point(**{**common, **own["candidate"]}, id=f"{d['id']}:candidate", config=sides["candidate"][0],
                 metric=first, value=published[first][1])
    if base.config == cand.config and (base.tp, base.kv_dtype) == (cand.tp, cand.kv_dtype):
        raise SpecError(f"{where}: knob pair {d['id']!r}: baseline and candidate configs are the same")
    return KnobPair(d["id"], str(d.get("change") or ""), base, cand, published)


def load_pairs(path: str | Path) -> list[KnobPair]:
    """The knob pairs of a table file; SpecError (one line) on a malformed pair or a repeated id."""
    data = read_table(path, "knob-effect table")
    pairs = [_pair(d, str(path)) for d in data.get("pairs", [])]
    for d in data.get("pairs", []):
        if "split" in d and d["split"] != split_of(str(d["url"]), str(d["id"])):
            raise SpecError(f"{path}: knob pair {d['id']!r} says split {d['split']!r}, its hash says "
                            f"{split_of(str(d['url']), str(d['id']))!r}")
    seen: set[str] = set()
    for p in pairs:
        if p.id in seen:
            raise SpecError(f"{path}: knob pair id {p.id!r} appears twice")
        seen.add(p.id)
    return pairs


@dataclass(frozen=True)
class EffectRow:
    pair: KnobPair
    metric: str
    published: float  # candidate / baseline as printed
    default: float  # the emulator's candidate / baseline with the default factors
    calibrated: float  # the same after calibrating on the baseline run's primary metric

    @staticmethod
    def _error(predicted: float, published: float) -> float:
        return predicted / published - 1.0

    @property
    def default_error(self) -> float:
        return self._error(self.default, self.published)

    @property
    def error(self) -> float:
        return self._error(self.calibrated, self.published)

    def agrees(self, ratio: float) -> bool:
        """Whether ``ratio`` moves the metric the way the published ratio does (up, down, or within NOISE)."""
        def way(r: float) -> int:
            return 0 if abs(r - 1.0) <= NOISE else (1 if r > 1.0 else -1)
        return way(ratio) == way(self.published)


@dataclass
class EffectReport:
    rows: list[EffectRow] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # pair id -> why the emulator could not replay it


def evaluate_pairs(pairs: Iterable[KnobPair], *, calibrate: bool = True) -> EffectReport:
    """Each pair's published ratios against the emulator's, per metric (``KnobPair.metrics``)."""
    from autoresearch_dagster.emulator.calibrate import default_params

    out = EffectReport()
    for pair in pairs:
        try:
            b, c = run_point(pair.baseline), run_point(pair.candidate)
            cb, cc = b, c
            if calibrate:
                eff = calibrate_on(pair.baseline, default_params(pair.baseline.model), prior_weight=0.1)
                cb, cc = run_point(pair.baseline, eff), run_point(pair.candidate, eff)
        except SpecError as e:
            out.failed[pair.id] = str(e)
            continue
        for m in pair.metrics:
            pb, pc = pair.published[m]
            if not all(math.isfinite(x) and x > 0 for x in (pb, pc, b[m], c[m], cb[m], cc[m])):
                continue
            out.rows.append(EffectRow(pair, m, pc / pb, c[m] / b[m], cc[m] / cb[m]))
    return out


def summarize(rows: list[EffectRow]) -> dict[str, float]:
    """Median and worst |ratio error| (default and calibrated) and the share of rows whose direction agrees."""
    if not rows:
        return {"n": 0}
    d, c = np.abs([r.default_error for r in rows]), np.abs([r.error for r in rows])
    return {"n": len(rows), "default_median": float(np.median(d)), "default_worst": float(d.max()),
            "calibrated_median": float(np.median(c)), "calibrated_worst": float(c.max()),
            "default_direction": float(np.mean([r.agrees(r.default) for r in rows])),
            "calibrated_direction": float(np.mean([r.agrees(r.calibrated) for r in rows]))}


def split_of(url: str, pair_id: str) -> str:
    """A pair's half, ``"fit"`` or ``"report"``, from the sha256 of its source URL and id: stable across table edits
    (adding a pair never moves another) and blind to the numbers. Mechanisms and factors may be tuned on the fit half
    only; the report half is what the benchmark scores."""
    h = hashlib.sha256(f"{url}\n{pair_id}".encode()).digest()
    return "fit" if h[0] % 2 == 0 else "report"


def pair_split(pair: KnobPair) -> str:
    return split_of(pair.baseline.url, pair.id)


def primary_rows(report: EffectReport) -> list[EffectRow]:
    return [r for r in report.rows if r.metric == r.pair.metrics[0]]


def changed_knobs(pair: KnobPair) -> list[str]:
    """The knob names the two runs' configs differ in (TP and KV dtype as ``tp`` / ``kv_dtype``)."""
    b, c = pair.baseline, pair.candidate
    out = sorted(k for k in set(b.config) | set(c.config) if b.config.get(k) != c.config.get(k))
    out += [k for k in ("tp", "kv_dtype") if getattr(b, k) != getattr(c, k)]
    return out or ["?"]


def half_scores(rows: list[EffectRow], fit_rows: list[EffectRow], *, confidence: float = 0.8) -> dict[str, float]:
    """On ``rows`` (one per pair, the primary metric) whose published change is beyond ``NOISE``: the share whose
    calibrated ratio moves the same way, the median |log(calibrated / published)|, and the share of published
    ratios inside the Corrector's interval (``agents.surrogate.Corrector``) after it has seen ``fit_rows`` as verdicts
    (predicted = calibrated emulator ratio, measured = published ratio); also that coverage with no verdict (prior)."""
    from autoresearch_dagster.agents.surrogate import Corrector

    moved = [r for r in rows if abs(r.published - 1.0) > NOISE]
    if not moved:
        return {"n": 0, "n_all": len(rows)}
    trained = Corrector()
    for r in fit_rows:
        trained.add(changed_knobs(r.pair), r.calibrated, r.published)

    def cover(cor: Corrector) -> float:
        hits = []
        for r in moved:
            _, lo, hi, _ = cor.predict(changed_knobs(r.pair), r.calibrated, confidence=confidence)
            hits.append(lo <= r.published <= hi)
        return float(np.mean(hits))

    logs = np.abs([math.log(r.calibrated / r.published) for r in moved])
    return {"n": len(moved), "n_all": len(rows), "direction": float(np.mean([r.agrees(r.calibrated) for r in moved])),
            "median_log_error": float(np.median(logs)), "worst_log_error": float(logs.max()),
            "coverage": cover(trained), "coverage_prior": cover(Corrector())}
