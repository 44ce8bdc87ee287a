"""Owns `autoresearch emulator fit-profiles`: the engines' efficiency profiles fitted on the validation table's fit half.

Fits the profile table (``emulator.engine_profiles.fit_profiles``: multipliers on the compute and HBM factor groups per
engine, release line and, where the fit half says they differ, GPU or architecture family) on the ``fit`` points of
the validation table only, prints each profile with its points and its fit error before and after, and writes the
table atomically: by default the one the lookup reads (``engine_profiles.PROFILES_FILE``), which the campaign's
surrogate starts from. Registered by ``cli/emulator.py``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autoresearch_dagster.spec import SpecError

DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "emulator_validation.json"


def register_fit_profiles(sub: Any) -> None:
    from autoresearch_dagster.emulator.engine_profiles import MIN_POINTS, PROFILES_FILE

    sp = sub.add_parser(
        "fit-profiles", help="fit the engines' efficiency profiles (per engine release) on the validation fit half",
        description="Fit the engine efficiency profiles (compute and HBM multipliers per engine, release line and, "
                    "where the fit half says they differ, GPU or architecture family) on the fit half of the "
                    "validation table only; print them and write the profile table.")
    sp.add_argument("--table", default=str(DEFAULT_TABLE), help=f"validation table (default {DEFAULT_TABLE})")
    sp.add_argument("--out", default=str(PROFILES_FILE),
                    help=f"profile table to write (default {PROFILES_FILE}: the one the lookup reads)")
    sp.add_argument("--min-points", type=int, default=MIN_POINTS,
                    help=f"fit points a profile needs (default {MIN_POINTS}); fewer: the release falls back")
    sp.add_argument("--max-evals", type=int, default=30, help="emulator evaluations per profile fit (default 30)")
    sp.set_defaults(func=_fit_profiles)


def _fit_profiles(args: argparse.Namespace) -> int:
    from autoresearch_dagster.emulator.engine_profiles import fit_fingerprint, fit_profiles, write_profiles
    from autoresearch_dagster.emulator.validation import load_table

    if args.min_points < 1:
        raise SpecError(f"--min-points must be at least 1, got {args.min_points}")
    points = load_table(args.table)
    n_fit = sum(p.split == "fit" for p in points)
    print(f"{len(points)} points in {args.table}; fitting on its {n_fit} fit-half points only")
    profiles = fit_profiles(points, min_points=args.min_points, max_evals=args.max_evals,
                            say=lambda m: print(f"  {m}", flush=True))
    for p in profiles:
        mult = ", ".join(f"{k} x{v:.3f}" for k, v in sorted(p.multipliers.items()))
        print(f"{p.label:28s} {mult:36s} {len(p.fit_points):3d} points, fit median |log error| "
              f"{p.error_before:.1%} -> {p.error_after:.1%}")
    print(f"wrote {write_profiles(profiles, args.out, table=Path(args.table).name, fingerprint=fit_fingerprint(points))}")
    return 0
