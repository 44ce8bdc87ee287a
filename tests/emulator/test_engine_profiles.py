"""Engine efficiency profiles: the lookup's fallback order, applying multipliers, and a fitter that sees only the
validation table's fit half."""
from __future__ import annotations

import dataclasses
import math

import pytest

from autoresearch_dagster.emulator import engine_profiles as ep
from autoresearch_dagster.emulator.cost import Efficiency
from autoresearch_dagster.emulator.engine_profiles import EngineProfile, fit_one, fit_profiles, profile_for
from autoresearch_dagster.emulator.validation import Point, Workload
from autoresearch_dagster.spec import SpecError

TABLE = [EngineProfile("sglang", "*", multipliers={"compute": 0.9}, fit_points=("a", "b", "c")),
         EngineProfile("sglang", "0.5.5", multipliers={"compute": 1.2, "memory": 1.1}, fit_points=("d", "e", "f")),
         EngineProfile("sglang", "0.5.5", gpu="H100", multipliers={"compute": 1.5}, fit_points=("g", "h", "i")),
         EngineProfile("sglang", "0.5.6..0.5.8", arch="moe", multipliers={"memory": 0.8}, fit_points=("j", "k", "l")),
         EngineProfile("vllm", "0.11.0", multipliers={"memory": 1.3}, fit_points=("m", "n", "o"))]


def test_lookup_picks_the_most_specific_profile_and_falls_back_with_its_reason():
    h100 = profile_for("sglang", "0.5.5.post1", "dense", "h100", TABLE)
    assert h100.profile is TABLE[2] and "0.5.5 H100" in h100.provenance
    a100 = profile_for("sglang", "0.5.5rc0", "dense", "A100", TABLE)  # a release line covers rc and post builds
    assert a100.profile is TABLE[1]
    assert profile_for("sglang", "0.5.7", "moe", "H200", TABLE).profile is TABLE[3]  # a release range, one family
    dense = profile_for("sglang", "0.5.7", "dense", "H200", TABLE)  # not that family: the engine's profile
    assert dense.profile is TABLE[0] and "no profile of its own" in dense.provenance
    unknown = profile_for("sglang", "unknown", "dense", "H100", TABLE)
    assert unknown.profile is TABLE[0] and "names no release" in unknown.provenance
    assert profile_for("modal", "0.5.5", "dense", "A100", TABLE).profile is TABLE[1]  # modal serves SGLang
    later = profile_for("vllm", "0.13.0", "dense", "H100", TABLE)  # no release profile and no engine profile: none
    assert later.profile is None and later.apply() == Efficiency() and "default factors" in later.provenance
    assert profile_for("emulator", "emulator-0.1+cm7.abc", "dense", "H100", TABLE).profile is None
    assert profile_for("vllm", "emulator-0.1+cm7.abc", "dense", "H100", TABLE).profile is None  # an emulated vLLM


def test_a_profile_multiplies_its_groups_and_caps_fractions():
    base = Efficiency()
    eff = EngineProfile("sglang", multipliers={"compute": 1.5, "memory": 2.0}).apply(base)
    assert eff.gemm_mfu == pytest.approx(min(base.gemm_mfu * 1.5, ep.FRACTION_CAP))
    assert eff.attn_mfu == pytest.approx(min(base.attn_mfu * 1.5, ep.FRACTION_CAP))
    assert eff.mbu == pytest.approx(min(base.mbu * 2.0, ep.FRACTION_CAP)) and eff.mbu <= ep.FRACTION_CAP
    assert eff.step_overhead_s == base.step_overhead_s  # outside the groups: unchanged


def test_a_malformed_table_is_refused(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"profiles": [{"engine": "vllm", "releases": "0.11.0", "multipliers": {"cpu": 1.1}}]}')
    with pytest.raises(SpecError, match="unknown groups"):
        ep.load_profiles(bad)
    bad.write_text('{"profiles": [{"engine": "vllm", "releases": "new", "multipliers": {}}]}')
    with pytest.raises(SpecError, match="releases"):
        ep.load_profiles(bad)


def _point(pid, engine, version, value, split, gpu="H100"):
    return Point(id=pid, source="s", url="https://example.org", source_quote=("q",), engine=engine,
                 engine_version=version, model="qwen3-8b", gpu=gpu, tp=1, weights="bf16", kv_dtype="bf16",
                 workload=Workload(kind="offline", dataset="random", num_prompts=10, input_len=100, output_len=100),
                 metric="total_token_throughput", value=value, unit="tok/s", split=split)


@pytest.fixture
def fake_emulator(monkeypatch):
    """A stand-in for the replay: throughput grows with the square roots of the GEMM and HBM rates (100 at the
    default factors), so a fit is instant and its answer known."""
    d = Efficiency()
    calls: list[str] = []

    def predict(p, eff=None, gpus=None):
        calls.append(p.id)
        e = eff or d
        return 100.0 * math.sqrt(e.gemm_mfu / d.gemm_mfu) * math.sqrt(e.mbu / d.mbu)

    import autoresearch_dagster.emulator.validation as validation

    monkeypatch.setattr(validation, "predict", predict)
    return calls


def test_the_fitter_sees_only_the_fit_half(fake_emulator):
    fit = [_point(f"v{i}", "vllm", "0.11.0", 120.0 + i, "fit") for i in range(4)]
    fit += [_point(f"s{i}", "sglang", "0.5.3.post3", 80.0, "fit") for i in range(3)]
    fit += [_point("s-lone", "sglang", "0.5.4.post2", 50.0, "fit")]  # one point: its release gets no profile
    report = [_point("r1", "vllm", "0.11.0", 300.0, "report"), _point("r2", "sglang", "0.5.9", 10.0, "holdout"),
              _point("r3", "vllm", "0.13.0", 90.0, "report")]
    first = fit_profiles(fit + report, min_points=3, max_evals=20)
    assert not {"r1", "r2", "r3"} & set(fake_emulator)  # never replayed, let alone fitted on
    changed = [dataclasses.replace(r, value=r.value * 7) for r in report]
    again = fit_profiles(fit + changed + [_point("r4", "vllm", "0.11.0", 1.0, "report")], min_points=3, max_evals=20)
    assert [p.to_dict() for p in again] == [p.to_dict() for p in first]
    labels = {p.label: p for p in first}
    assert set(labels) == {"sglang *", "sglang 0.5.3", "vllm *", "vllm 0.11.0"}  # no 0.5.4, 0.5.9 or 0.13 profile
    assert all(set(p.fit_points) <= {q.id for q in fit} for p in first)
    gain = lambda p: p.multipliers["compute"] * p.multipliers["memory"]  # noqa: E731
    assert gain(labels["vllm 0.11.0"]) > 1.1 and gain(labels["sglang 0.5.3"]) < 0.9  # toward each engine's points
    assert labels["vllm 0.11.0"].error_after < labels["vllm 0.11.0"].error_before
    # the one 0.5.4 point falls back to the engine's profile; a release after the fitted ones too
    assert profile_for("sglang", "0.5.4.post2", "dense", "H100", first).profile is labels["sglang *"]
    assert profile_for("vllm", "0.13.0", "dense", "H100", first).profile is labels["vllm *"]


def test_fit_one_refuses_a_point_outside_the_fit_half(fake_emulator):
    with pytest.raises(SpecError, match="'fit' half only"):
        fit_one([_point("r", "vllm", "0.11.0", 1.0, "report")], engine="vllm")


def test_the_campaign_prior_is_the_profile_of_the_endpoint_engine_release():
    from autoresearch_dagster.campaign.grounding import start_from_profile

    eff, why = start_from_profile("vllm", "0.11.0", "qwen3-8b", "H100")
    choice = profile_for("vllm", "0.11.0", "dense", "H100")
    assert why == choice.provenance
    assert eff == (choice.apply().__dict__ if choice.profile else None)
    none, why = start_from_profile("emulator", "emulator-0.1+cm7.abc", "qwen3-8b", "H100")
    assert none is None and "no profile" in why


def test_a_campaign_on_an_sglang_release_starts_its_surrogate_from_that_release_profile(tmp_path, monkeypatch):
    from autoresearch_dagster.campaign.loop import CampaignRunner
    from autoresearch_dagster.campaign.state import CampaignSettings
    from autoresearch_dagster.engines.emulator import EmulatorEngine

    from ..agents.helpers import long_prompt_pool, small_endpoint

    table = tmp_path / "profiles.json"
    ep.write_profiles([EngineProfile("sglang", "0.5.5", multipliers={"compute": 1.3, "memory": 0.8},
                                     fit_points=("x", "y", "z"))], table, table="t", fingerprint="-")
    monkeypatch.setattr(ep, "PROFILES_FILE", table)

    class Release(EmulatorEngine):  # an SGLang server of a known release (the emulator underneath)
        name = "sglang"

        def version(self):
            return "0.5.5.post1"

    endpoint = small_endpoint()
    said: list[str] = []
    r = CampaignRunner(endpoint, long_prompt_pool(tmp_path), engine=Release(endpoint), out_dir=tmp_path / "c",
                       settings=CampaignSettings(), say=said.append)
    eff = r.surrogate().efficiency
    assert eff == EngineProfile("sglang", multipliers={"compute": 1.3, "memory": 0.8}).apply()
    assert eff.mbu < Efficiency().mbu and "profile 'sglang 0.5.5'" in r.state.surrogate["profile"]
    assert any("engine profile" in m for m in said)
    plain = CampaignRunner(endpoint, long_prompt_pool(tmp_path / "p"), engine=EmulatorEngine(endpoint),
                           out_dir=tmp_path / "e", settings=CampaignSettings())
    assert plain.surrogate().efficiency == Efficiency()  # the emulator engine itself: no profile


def test_fit_profiles_cli_writes_a_table_fitted_on_the_fit_points_only(tmp_path, capsys):
    import json
    from pathlib import Path

    from autoresearch_dagster.cli import main

    src = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/data/emulator_validation.json").read_text())
    fit = [d for d in src["points"] if d["engine_version"] == "0.5.3.post3" and d["split"] == "fit"][:3]
    report = [d for d in src["points"] if d["split"] == "report"][:1]
    table, out = tmp_path / "t.json", tmp_path / "profiles.json"
    table.write_text(json.dumps({"points": fit + report}))
    assert main(["emulator", "fit-profiles", "--table", str(table), "--out", str(out), "--max-evals", "2"]) == 0
    written = ep.load_profiles(out)
    assert {p.label for p in written} == {"sglang *", "sglang 0.5.3"}
    assert all(set(p.fit_points) == {d["id"] for d in fit} for p in written)
    assert "fitting on its 3 fit-half points only" in capsys.readouterr().out
