from __future__ import annotations

import json

import pytest

from autoresearch_dagster.emulator.catalog import gpu, model_card
from autoresearch_dagster.emulator.core import EngineCore
from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.sim import simulate
from autoresearch_dagster.emulator.spec_acceptance import SpecAcceptance
from tests.emulator.helpers import reqs

EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 4, "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": 5}


def _decode_tps(acceptance):
    c = EngineCore(model_card("llama-3.1-8b"), gpu("H100"), 1, EAGLE, seed=0, noise=NoiseSettings.off(),
                   acceptance=acceptance)
    res = simulate(c, reqs(16, 200, 300, every=0.0))
    out = sum(r.output_tokens for r in res.requests)
    return out / max(r.end_s for r in res.requests), c


def test_decode_throughput_follows_the_measured_acceptance(tmp_path):
    f = tmp_path / "acc.json"
    f.write_text(json.dumps({"k": 4, "per_position": [0.9, 0.85, 0.8, 0.8]}))
    high = SpecAcceptance.load(f)
    low = SpecAcceptance((0.2, 0.1))
    tps_low, c_low = _decode_tps(low)
    tps_high, c_high = _decode_tps(high)
    assert tps_high > 1.5 * tps_low
    # the emulator's reported accept length is the measured one (within sampling noise)
    for c, acc in ((c_low, low), (c_high, high)):
        rep = c.replicas[0]
        measured = rep.c["spec_accepted_tokens_total"] / rep.c["spec_slots_total"]
        assert measured == pytest.approx(acc.mean_accept_length(4), rel=0.08)


def test_reported_accept_length_inverts_to_a_rate():
    a = SpecAcceptance.from_accept_length(2.5, 4)
    assert a.mean_accept_length(4) == pytest.approx(2.5, abs=1e-6)
    with pytest.raises(ValueError):
        SpecAcceptance.from_accept_length(6.0, 4)
    with pytest.raises(ValueError):
        SpecAcceptance((1.2,))


def test_engine_options_carry_the_measured_acceptance_into_a_deployment(tmp_path):
    from autoresearch_dagster.engines.emulator import EmulatorEngine
    from autoresearch_dagster.spec import EndpointSpec

    f = tmp_path / "acc.json"
    f.write_text(json.dumps({"k": 2, "per_position": [0.5, 0.25]}))

    def ep(opts):
        return EndpointSpec(name="t", model="llama-3.1-8b", hardware={"gpu": "H100", "count": 1},
                            sla="ttft_p99<=3000ms,tpot_p99<=60ms", engine_options=opts)

    dep = EmulatorEngine(ep({"spec_acceptance": str(f)})).deploy(EAGLE)
    assert list(dep.core.replicas[0].spec_rates) == [0.5, 0.25, 0.25, 0.25]
    dep = EmulatorEngine(ep({"spec_acceptance": 3.0})).deploy(EAGLE)
    assert dep.core.acceptance.mean_accept_length(4) == pytest.approx(3.0, abs=1e-6)
    stock = EmulatorEngine(ep({})).deploy(EAGLE)
    assert stock.core.acceptance is None and len(set(stock.core.replicas[0].spec_rates)) == 1
