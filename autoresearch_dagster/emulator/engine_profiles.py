"""Owns the engines' efficiency profiles: what an endpoint's engine and release (SGLang / vLLM, version) say about
its efficiency factors before any of its own measurements.

The emulator's default ``Efficiency`` factors are shared by every engine; where one page ran SGLang and vLLM on the
same model, GPU and traffic the published ratio of the two moves from one release to the next, which one shared
factor set cannot follow. A profile is a few multipliers on groups of factors (``GROUPS``: the GEMM/attention rates,
the HBM streaming rates), keyed by engine, a release range and optionally an architecture family (dense / MoE) and a
GPU, fitted on the validation table's ``fit`` half only (``fit_profiles``; ``autoresearch emulator fit-profiles``;
``benchmarks/bench_emulator_fidelity.py`` prints them against the same-page engine pairs of the other halves). The
committed table is ``engine_profiles.json`` beside this module.

``profile_for(engine, version, arch, gpu)`` picks the most specific profile that matches: the release's profile for
that GPU and architecture family, then for that GPU, then for that family, then the release's own, then the engine's
profile fitted on every release's fit points, then none; its ``provenance`` says which and why. The campaign's
surrogate starts from the profile (``campaign.grounding.start_from_profile``) when no stored calibration of the
endpoint applies, and the endpoint's own calibration refines it from there. An emulator endpoint (its version is
the emulator's own) has no profile: its factors are the emulator's.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from autoresearch_dagster.emulator.cost import NOT_FRACTIONS, Efficiency
from autoresearch_dagster.spec import SpecError

PROFILES_FILE = Path(__file__).parent / "engine_profiles.json"
# The factor groups a profile multiplies: what an engine's kernels make of the GPU's compute peak (dense, MoE,
# fp8 and weight-only GEMMs, attention) and of its HBM bandwidth (weight and KV streaming).
GROUPS: dict[str, tuple[str, ...]] = {
    "compute": ("gemm_mfu", "moe_mfu", "attn_mfu", "fp8_mfu", "w8a16_mfu"),
    "memory": ("mbu", "kv_mbu"),
}
MIN_POINTS = 3  # fit points a profile needs (fewer: the lookup falls back to a wider profile)
SPLIT_GAIN = 0.02  # a release's split by GPU or by family is kept when it lowers its fit median |log error| this much
PRIOR_WEIGHT = 0.3  # Gaussian prior on the log-multipliers around 1 (few points cannot pin two multipliers)
MULTIPLIER_BOUNDS = (0.25, 4.0)
FRACTION_CAP = 0.98  # an achieved fraction of a peak stays below the peak
ENGINE_OF = {"sglang": "sglang", "modal": "sglang", "vllm": "vllm"}  # endpoint engine kind -> profiled engine


def release(version: str | None) -> tuple[int, int, int] | None:
    """The release line of a version string ("0.5.3rc0", "0.5.3.post3", "v0.11.0" -> (0, 5, 3)); None when it names
    no release ("unknown", the emulator's own "emulator-...")."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(version or "").strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def _fmt(r: tuple[int, int, int]) -> str:
    return ".".join(map(str, r))


def in_range(releases: str, version: str | None) -> bool:
    """Whether ``version`` falls in a profile's ``releases``: "*" (every release, and versions that name none),
    "0.5.3" (that release line: rc, post), "0.5.3..0.5.5" (inclusive)."""
    if releases == "*":
        return True
    r = release(version)
    if r is None:
        return False
    lo, _, hi = releases.partition("..")
    lo_r, hi_r = release(lo), release(hi or lo)
    if lo_r is None or hi_r is None:
        raise SpecError(f"engine profile releases {releases!r} is not '*', 'X.Y.Z' or 'X.Y.Z..X.Y.Z'")
    return lo_r <= r <= hi_r


def arch_family(model: str) -> str:
    """The architecture family a profile may be keyed by: "moe" (routed experts) or "dense"."""
    from autoresearch_dagster.emulator.catalog import model_card

    return "moe" if model_card(model).is_moe else "dense"


@dataclass(frozen=True)
class EngineProfile:
    """One row of the profile table: multipliers on ``GROUPS`` for an engine, release range, family and GPU."""
    engine: str
    releases: str = "*"
    arch: str = ""  # "" = every family
    gpu: str = ""  # "" = every GPU
    multipliers: dict[str, float] = field(default_factory=dict)
    fit_points: tuple[str, ...] = ()  # the validation points (all of the fit half) it was fitted on
    error_before: float = math.nan  # median |log error| on those points with the default factors
    error_after: float = math.nan  # ... with the profile

    def matches(self, engine: str, version: str | None, arch: str, gpu: str) -> bool:
        return (self.engine == engine and in_range(self.releases, version) and self.arch in ("", arch)
                and self.gpu in ("", gpu.upper()))

    @property
    def specificity(self) -> tuple[int, int, int]:
        return (self.releases != "*", self.gpu != "", self.arch != "")

    @property
    def label(self) -> str:
        return f"{self.engine} {self.releases}" + "".join(f" {x}" for x in (self.gpu, self.arch) if x)

    def apply(self, eff: Efficiency | None = None) -> Efficiency:
        base = eff or Efficiency()
        new: dict[str, float] = {}
        for group, m in self.multipliers.items():
            for k in GROUPS[group]:
                v = getattr(base, k) * float(m)
                new[k] = v if k in NOT_FRACTIONS else min(v, FRACTION_CAP)
        return base.replace(**new)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fit_points"] = list(self.fit_points)
        return d


@dataclass(frozen=True)
class ProfileChoice:
    """What ``profile_for`` picked (None: no profile) and why."""
    profile: EngineProfile | None
    provenance: str

    def apply(self, eff: Efficiency | None = None) -> Efficiency:
        return self.profile.apply(eff) if self.profile else (eff or Efficiency())

    @property
    def multipliers(self) -> dict[str, float]:
        return dict(self.profile.multipliers) if self.profile else {}


def load_profiles(path: str | Path | None = None) -> list[EngineProfile]:
    """The profiles of a table file (default ``PROFILES_FILE``; none when the file is missing); SpecError (one line)
    on a malformed one."""
    p = Path(PROFILES_FILE if path is None else path)
    if not p.is_file():
        return []
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        out = [EngineProfile(**{**d, "fit_points": tuple(d.get("fit_points", ()))}) for d in data.get("profiles", [])]
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise SpecError(f"engine profile table {p} cannot be read: {e}") from None
    for prof in out:
        unknown = set(prof.multipliers) - set(GROUPS)
        if unknown:
            raise SpecError(f"{p}: profile {prof.label!r} multiplies unknown groups {sorted(unknown)}")
        in_range(prof.releases, "0.0.0")  # a malformed range fails here, not at lookup
    return out


def profile_for(engine: str, version: str | None, arch: str = "", gpu: str = "",
                profiles: Iterable[EngineProfile] | None = None) -> ProfileChoice:
    """The most specific profile for an endpoint's engine kind (``ENGINE_OF``), version, architecture family
    (``arch_family``) and GPU, with its provenance (see the module docstring for the fallback order)."""
    table = list(load_profiles() if profiles is None else profiles)
    kind = ENGINE_OF.get(engine)
    if kind is None:
        return ProfileChoice(None, f"engine {engine!r}: no profile (profiles exist for {', '.join(sorted(ENGINE_OF))})")
    if str(version or "").startswith("emulator"):
        return ProfileChoice(None, f"{engine} {version}: the endpoint is the emulator itself: no engine profile")
    found = [p for p in table if p.matches(kind, version, arch, gpu)]
    if not found:
        return ProfileChoice(None, f"{kind} {version}: no profile in the table for this engine: the default factors")
    best = max(found, key=lambda p: p.specificity)
    n = len(best.fit_points)
    how = f"profile '{best.label}' fitted on {n} fit-half point(s), {_mult(best)}"
    if best.releases != "*":
        return ProfileChoice(best, f"{kind} {version}: {how}")
    fitted = sorted({p.releases for p in table if p.engine == kind and p.releases != "*"})
    why = ("the version names no release" if release(version) is None
           else f"release {_fmt(release(version))} has no profile of its own (fitted: {', '.join(fitted) or 'none'})")
    return ProfileChoice(best, f"{kind} {version}: {why}: the engine's {how}")


def _mult(p: EngineProfile) -> str:
    return ", ".join(f"{k} x{v:.3f}" for k, v in sorted(p.multipliers.items())) or "no multiplier"


# ------------------------------------------------------------------------------------------ fit

def fit_one(points: list[Any], *, engine: str, releases: str = "*", arch: str = "", gpu: str = "",
            groups: tuple[str, ...] = tuple(GROUPS), base: Efficiency | None = None, max_evals: int = 30,
            defaults: dict[str, float] | None = None) -> EngineProfile:
    """Multipliers on ``groups`` fitted to ``points`` (validation points of the ``fit`` half: refuses others) by
    bounded least squares on log(predicted / published), soft-L1 loss, with ``PRIOR_WEIGHT`` on the
    log-multipliers. ``defaults``: the points' predictions with ``base`` where already made, by id."""
    from scipy.optimize import least_squares

    from autoresearch_dagster.emulator.validation import predict

    if any(p.split != "fit" for p in points):
        raise SpecError("an engine profile is fitted on the validation table's 'fit' half only")
    base = base or Efficiency()
    made = defaults or {}
    lo, hi = np.log(MULTIPLIER_BOUNDS[0]), np.log(MULTIPLIER_BOUNDS[1])

    def prof(x: np.ndarray) -> EngineProfile:
        return EngineProfile(engine, releases, arch, gpu, {g: float(math.exp(v)) for g, v in zip(groups, x)})

    def logs(eff: Efficiency) -> np.ndarray:
        return np.array([math.log(max(predict(p, eff), 1e-9) / p.value) for p in points])

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([logs(prof(x).apply(base)), PRIOR_WEIGHT * x])

    before = np.array([math.log(max(made[p.id] if p.id in made else predict(p, base), 1e-9) / p.value)
                       for p in points])
    sol = least_squares(residuals, np.zeros(len(groups)), bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                        diff_step=0.02, max_nfev=max_evals)
    out = prof(sol.x)
    after = logs(out.apply(base))
    return EngineProfile(engine, releases, arch, gpu, {k: round(v, 4) for k, v in out.multipliers.items()},
                         tuple(sorted(p.id for p in points)), round(float(np.median(np.abs(before))), 4),
                         round(float(np.median(np.abs(after))), 4))


def _median_after(profiles: list[EngineProfile]) -> float:
    """The fit error of a split: its parts' median |log error| after the fit, averaged weighted by their points."""
    n = sum(len(p.fit_points) for p in profiles)
    return sum(p.error_after * len(p.fit_points) for p in profiles) / n if n else math.nan


def fit_profiles(points: Iterable[Any], *, min_points: int = MIN_POINTS, groups: tuple[str, ...] = tuple(GROUPS),
                 base: Efficiency | None = None, max_evals: int = 30, say: Any = None) -> list[EngineProfile]:
    """The profile table fitted on the ``fit`` half of ``points`` (the others are dropped before anything is
    computed: a report or holdout point cannot move a profile). Per engine: the engine's profile on all of its fit
    points; per release line with ``min_points`` fit points: the release's profile, and its split by GPU or by
    architecture family where every part has ``min_points`` and the split lowers the release's fit error
    (``_median_after``) by ``SPLIT_GAIN`` (the parts are kept beside the release's own, which serves the release's
    other GPUs and families)."""
    from autoresearch_dagster.emulator.validation import predict

    say = say or (lambda _m: None)
    fit = [p for p in points if p.split == "fit"]
    base = base or Efficiency()
    defaults = {p.id: predict(p, base) for p in fit}
    kw = dict(groups=groups, base=base, max_evals=max_evals, defaults=defaults)
    out: list[EngineProfile] = []
    for engine in sorted({p.engine for p in fit}):
        mine = [p for p in fit if p.engine == engine]
        if len(mine) >= min_points:
            out.append(fit_one(mine, engine=engine, **kw))
            say(f"{out[-1].label}: {len(mine)} points")
        for rel in sorted({release(p.engine_version) for p in mine} - {None}):
            group = [p for p in mine if release(p.engine_version) == rel]
            if len(group) < min_points:
                say(f"{engine} {_fmt(rel)}: {len(group)} fit point(s), fewer than {min_points}: no profile")
                continue
            if out and out[-1].engine == engine and out[-1].releases == "*" and len(group) == len(mine):
                whole = replace(out[-1], releases=_fmt(rel))  # the engine's only release: the same fit
            else:
                whole = fit_one(group, engine=engine, releases=_fmt(rel), **kw)
            out.append(whole)
            say(f"{whole.label}: {len(group)} points")
            best: list[EngineProfile] = []
            for dim in ("gpu", "arch"):
                key = (lambda p: p.gpu.upper()) if dim == "gpu" else (lambda p: arch_family(p.model))
                parts = sorted({key(p) for p in group})
                sizes = [sum(key(p) == v for p in group) for v in parts]
                if len(parts) < 2 or min(sizes) < min_points:
                    continue
                split = [fit_one([p for p in group if key(p) == v], engine=engine, releases=_fmt(rel),
                                 **{dim: v}, **kw) for v in parts]
                gain = whole.error_after - _median_after(split)
                say(f"{whole.label} split by {dim} ({', '.join(parts)}): fit error {whole.error_after:.3f} -> "
                    f"{_median_after(split):.3f}")
                if gain >= SPLIT_GAIN and (not best or _median_after(split) < _median_after(best)):
                    best = split
            out += best
    return out


def fit_fingerprint(points: Iterable[Any]) -> str:
    """A hash of the fit half's points (ids and values): what a stored table was fitted on."""
    blob = json.dumps(sorted((p.id, p.value) for p in points if p.split == "fit"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def write_profiles(profiles: list[EngineProfile], path: str | Path, *, table: str, fingerprint: str) -> Path:
    from autoresearch_dagster.outputs.files import atomic_write_text

    groups = "; ".join(f"{k}: {', '.join(v)}" for k, v in GROUPS.items())
    data = {"about": "Engine efficiency profiles: multipliers on the Efficiency factor groups "
                     f"({groups}) per engine, release range, "
                     "architecture family and GPU, fitted on the fit half of the validation table only "
                     "(autoresearch emulator fit-profiles; emulator/engine_profiles.py). releases '*' is the engine's "
                     "profile over every release's fit points (the fallback of releases without their own).",
            "fitted_on": {"table": table, "fit_half_fingerprint": fingerprint, "min_points": MIN_POINTS,
                          "prior_weight": PRIOR_WEIGHT, "split_gain": SPLIT_GAIN},
            "profiles": [p.to_dict() for p in profiles]}
    p = Path(path)
    atomic_write_text(p, json.dumps(data, indent=1) + "\n")
    return p
