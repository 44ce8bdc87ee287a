"""The surrogate: capacities from the emulator's documented factors, infeasible configs, learned corrections."""
from autoresearch_dagster.agents.surrogate import Corrector, Surrogate
from autoresearch_dagster.emulator.cost import Efficiency, hidden_efficiency
from autoresearch_dagster.engines.emulator import EmulatorEngine

from .helpers import FAST, long_prompt_pool, small_endpoint


def test_the_surrogate_predicts_capacities_caches_them_and_knows_infeasible_configs(tmp_path):
    ep = small_endpoint(engine_options={"hidden_factors_seed": 3})
    sur = Surrogate(ep, long_prompt_pool(tmp_path), capacity=FAST)
    base, fp8, tp2 = sur.evaluate([{}, {"quantization": "fp8"}, {"tp_size": 2}])
    assert base.feasible and base.capacity_rps > 0 and fp8.capacity_rps > base.capacity_rps
    assert not tp2.feasible and "exceeds" in tp2.reason
    assert sur.evaluations == 3
    sur.evaluate([{}])
    assert sur.evaluations == 3  # cached
    # the surrogate never takes the endpoint engine's hidden factors
    assert sur.efficiency == Efficiency() and EmulatorEngine(ep).efficiency == hidden_efficiency(3)
    assert base.latency_at("ttft", base.capacity_rps) is not None


def test_the_corrector_learns_a_bias_from_verdicts_and_narrows_with_evidence():
    c = Corrector(prior_sigma=0.12, measurement_cv=0.02)
    r0, lo0, hi0, basis0 = c.predict(["enable_mixed_chunk"], 1.4)
    assert r0 == 1.4 and lo0 < 1.4 < hi0 and "no verdict yet" in basis0
    for _ in range(4):  # the surrogate keeps over-predicting mixed chunks by ~10%
        c.add(["enable_mixed_chunk"], 1.4, 1.27)
    r1, lo1, hi1, _ = c.predict(["enable_mixed_chunk"], 1.4)
    assert 1.27 < r1 < 1.4 and (hi1 - lo1) < (hi0 - lo0)
    r2, *_ = c.predict(["page_size"], 1.1)  # other knobs borrow only a little of that bias
    assert 1.1 * (r1 / 1.4) < r2 < 1.1
