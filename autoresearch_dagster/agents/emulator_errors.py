"""Owns the emulator error report: how far the calibrated emulator's predictions were from what was measured.

Every verified experiment (a better / same / worse verdict with a measured median ratio) leaves one
row in the lake's ``emulator_errors`` table: the capacity ratio the calibrated emulator predicted for
the candidate against the baseline (the surrogate's raw ratio, before the campaign's verdict-learned
correction), the measured ratio, and ``log_error = ln(measured / emulated)``. Rows are grouped by
**knob family**: the research direction ``spec.KNOBS`` gives each changed knob (scheduling & cache,
speculative decoding, kernels & quantization, parallelism & admission); a change spanning families
counts in each of them.

**Drift**: the emulator's error is drifting when the median |log error| of the last ``window``
verified experiments measured under the current calibration version exceeds ``threshold``. The
campaign then re-calibrates (``campaign.loop``): a fit over the baseline's and those candidates'
measured curves, stored as the endpoint's next calibration version with the drift statistics.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

from autoresearch_dagster.agents.orchestrator import control_groups

DEFAULT_WINDOW = 3
DEFAULT_THRESHOLD = 0.10  # median |ln(measured / emulated)|: about 10% off


def families(knobs: list[str] | dict[str, Any]) -> list[str]:
    """The knob families a change touches, sorted: the groups a promoted change is ablated in (KNOBS directions,
    'other' for a knob KNOBS lacks)."""
    return sorted(control_groups(dict.fromkeys(knobs)))


def error_row(*, experiment_id: str, proposal_id: str, campaign_id: str, round_no: int, era: int,
              knobs: list[str], emulated_ratio: float, measured_ratio: float, verdict: str,
              ci: tuple[float | None, float | None], calibration_version: int | None, surrogate_model: str,
              baseline_rps: float, candidate_rps: float, recorded_at: Any) -> dict[str, Any]:
    """One ``emulator_errors`` row (see the module docstring)."""
    log_error = math.log(measured_ratio / emulated_ratio)
    fam = families(knobs)
    return {"experiment_id": experiment_id, "proposal_id": proposal_id, "campaign_id": campaign_id, "round": round_no,
            "era": era, "knobs": sorted(knobs), "families": fam, "family": "+".join(fam),
            "emulated_ratio": emulated_ratio, "measured_ratio": measured_ratio, "ci_low": ci[0], "ci_high": ci[1],
            "log_error": log_error, "abs_log_error": abs(log_error), "verdict": verdict,
            "emulated_baseline_rps": baseline_rps, "emulated_candidate_rps": candidate_rps,
            "calibration_version": calibration_version, "surrogate_model": surrogate_model, "recorded_at": recorded_at}


@dataclass
class Drift:
    drifting: bool
    n: int  # experiments the rule looked at
    window: int
    threshold: float
    median_abs_log_error: float | None
    calibration_version: int | None
    experiments: list[str]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def drift(rows: list[dict[str, Any]], *, window: int = DEFAULT_WINDOW, threshold: float = DEFAULT_THRESHOLD) -> Drift:
    """The drift rule over ``rows`` (one endpoint's, any order): the last ``window`` rows of the newest
    calibration version they carry."""
    ordered = sorted(rows, key=lambda r: (str(r.get("recorded_at")), r.get("experiment_id") or ""))
    version = ordered[-1].get("calibration_version") if ordered else None
    current = [r for r in ordered if r.get("calibration_version") == version][-window:]
    if len(current) < window:
        return Drift(False, len(current), window, threshold, None, version, [r["experiment_id"] for r in current],
                     f"{len(current)} of {window} verified experiments under calibration "
                     f"{'v' + str(version) if version else '(none)'}: too few to judge")
    med = float(median(abs(float(r["log_error"])) for r in current))
    drifting = med > threshold
    return Drift(drifting, len(current), window, threshold, med, version, [r["experiment_id"] for r in current],
                 f"median |log error| {med:.3f} of the last {window} verified experiments "
                 f"{'exceeds' if drifting else 'is within'} {threshold:.3f}")


def error_report(rows: list[dict[str, Any]], *, window: int = DEFAULT_WINDOW,
                 threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """By knob family (n, median |error|, bias, worst), the timeline (each experiment with the running median
    |error| of the last ``window``), and the drift rule's answer."""
    ordered = sorted(rows, key=lambda r: (str(r.get("recorded_at")), r.get("experiment_id") or ""))
    by_family: dict[str, list[float]] = {}
    for r in ordered:
        for f in r.get("families") or [r.get("family") or "other"]:
            by_family.setdefault(f, []).append(float(r["log_error"]))
    fam_rows = [{"family": f, "n": len(v), "median_abs_error": float(median(abs(x) for x in v)),
                 "bias": math.expm1(sum(v) / len(v)), "worst_abs_error": max(abs(x) for x in v)}
                for f, v in sorted(by_family.items())]
    timeline = []
    for i, r in enumerate(ordered):
        last = ordered[max(0, i + 1 - window): i + 1]
        timeline.append({"recorded_at": str(r.get("recorded_at")), "experiment_id": r.get("experiment_id"),
                         "family": r.get("family"), "calibration_version": r.get("calibration_version"),
                         "emulated_ratio": r.get("emulated_ratio"), "measured_ratio": r.get("measured_ratio"),
                         "log_error": float(r["log_error"]),
                         "rolling_median_abs_error": float(median(abs(float(x["log_error"])) for x in last))})
    errs = [abs(float(r["log_error"])) for r in ordered]
    return {"n": len(ordered), "median_abs_error": float(median(errs)) if errs else None, "families": fam_rows,
            "timeline": timeline, "drift": drift(rows, window=window, threshold=threshold).to_dict()}


def to_markdown(report: dict[str, Any]) -> str:
    """The report as the markdown the CLI prints and the Dagster asset shows."""
    lines = [f"emulator error over {report['n']} verified experiment(s): median |ln(measured / emulated)| "
             + (f"{report['median_abs_error']:.3f}" if report["median_abs_error"] is not None else "-"), "",
             "| knob family | n | median abs error | bias (measured / emulated - 1) | worst |", "|---|---|---|---|---|"]
    lines += [f"| {f['family']} | {f['n']} | {f['median_abs_error']:.3f} | {f['bias']:+.1%} | {f['worst_abs_error']:.3f} |"
              for f in report["families"]]
    lines += ["", "| when | experiment | family | calibration | emulated | measured | log error | rolling median |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {t['recorded_at'][:19]} | {t['experiment_id']} | {t['family']} | v{t['calibration_version']} | "
              f"{t['emulated_ratio']:.3f} | {t['measured_ratio']:.3f} | {t['log_error']:+.3f} | "
              f"{t['rolling_median_abs_error']:.3f} |" for t in report["timeline"]]
    d = report["drift"]
    lines += ["", f"drift: {'YES' if d['drifting'] else 'no'} ({d['reason']})"]
    return "\n".join(lines)
