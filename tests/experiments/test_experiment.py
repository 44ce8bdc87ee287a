"""The experiments package end to end over fake engines with known true capacities, and RUNNER's real capacity search."""
from __future__ import annotations

import json

import pytest

from autoresearch_dagster.engines.base import EngineError
from autoresearch_dagster.experiments import experiment, stats
from autoresearch_dagster.experiments.ablation import run_ablation
from autoresearch_dagster.experiments.campaign import start_campaign
from autoresearch_dagster.experiments.experiment import run_experiment
from autoresearch_dagster.experiments.noise import measure_noise
from autoresearch_dagster.experiments.runs import HarnessSettings, RunRecord
from autoresearch_dagster.measure.profiles import CapacitySettings
from autoresearch_dagster.results import open_lake
from autoresearch_dagster.spec import Budget, EndpointSpec

from .helpers import Faults, FakeEngine, make_pool

BASE = 10.0
FAST = CapacitySettings(step_duration_s=6, min_completed=5, warmup_s=0, resolution=0.01, start_rps=1.0)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return make_pool(tmp_path_factory.mktemp("pool"))


@pytest.fixture
def endpoint():
    return EndpointSpec(name="demo", model="m", hardware={"gpu": "H200", "count": 2},
                        sla="ttft_p99<=1000ms,errors<=1%", server_config={"schedule_policy": "fcfs"})


def cap_of(gains: dict[tuple[str, object], float]):
    def f(config):
        c = BASE
        for (k, v), g in gains.items():
            if config.get(k) == v:
                c *= g
        return c
    return f


def settings(**kw):
    return HarnessSettings(capacity=FAST, warmup_requests=4, **kw)


def test_clear_gain_is_better_confirmed_with_abab_order_and_recorded(endpoint, pool, tmp_path):
    lake = open_lake(tmp_path / "lake")
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.25}), noise_cv=0.01)
    camp = start_campaign(endpoint, pool, results=lake, engine_name="fake")
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         results=lake, settings=settings(), campaign=camp)
    assert res.verdict == "better" and res.confirmed
    assert 1.15 < res.stats.ratio_median < 1.35
    arms = [r.arm for r in res.runs]
    assert arms == ["baseline", "candidate"] * (len(arms) // 2)  # ABAB
    assert len({r.seed for r in res.runs}) == len(res.runs)  # a fresh seed per run
    assert {r.purpose for r in res.runs} == {"experiment", "confirmation"}
    assert all(d.closed for _, _, d in eng.deployments)  # every deployment torn down
    d = res.to_dict()
    assert d["runs_baseline"] == d["runs_candidate"] == 10 and d["lossy"] is False and d["correctness"] is None
    assert lake.query("SELECT count(*) FROM runs WHERE experiment_id = ?", [res.experiment_id]) == [(20,)]
    assert lake.query("SELECT verdict, confirmed FROM experiments") == [("better", True)]
    assert lake.query("SELECT count(*) > 0 FROM load_steps") == [(True,)]
    assert lake.query("SELECT count(DISTINCT stage) FROM verdicts") == [(2,)]
    assert lake.query("SELECT engine_version FROM runs LIMIT 1") == [("fake-1.0",)]


def test_clear_loss_is_worse_without_confirmation(endpoint, pool):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 0.75}), noise_cv=0.01)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings())
    assert res.verdict == "worse" and not res.confirmed
    assert res.runs_baseline == res.runs_candidate == 5
    assert {r.purpose for r in res.runs} == {"experiment"}


def test_no_effect_is_same(endpoint, pool):
    eng = FakeEngine(cap_of({}), noise_cv=0.002)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(), noise_cv=0.01)
    assert res.verdict == "same" and res.noise_source == "noise_baseline"
    assert res.stats.equivalence_shown and res.stats.margin == pytest.approx(0.02)


def test_undecided_adds_runs_then_stops_at_the_cap_as_same(endpoint, pool, monkeypatch):
    monkeypatch.setattr(stats, "EXTENSION_RULE", "promising")  # an estimate inside the margin gets no extension
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.02}), noise_cv=0.06)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(confirm=False), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=6),
                         noise_cv=0.005)  # a 2% margin against 6%-CV runs: cannot decide
    stages = [s["stage"] for s in res.stages]
    assert stages[:2] == ["n=3", "n=6"] and stages[-1] == "stopped"
    assert res.verdict == "same" and "run cap of 6" in res.reason and not res.stats.equivalence_shown
    assert res.runs_baseline == res.runs_candidate == 6


def test_an_undecided_comparison_whose_decision_is_within_reach_gets_the_extension(endpoint, pool, monkeypatch):
    """"reachable" (the default): at the cap, an estimate inside the margin whose 90% bound still reaches the margin
    of twice the runs keeps going in steps of the first stage, and stops at twice the cap."""
    monkeypatch.setattr(stats, "EXTENSION_RULE", "reachable")
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.02}), noise_cv=0.06)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(confirm=False), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=6),
                         noise_cv=0.005)
    stages = [s["stage"] for s in res.stages]
    assert stages[:2] == ["n=3", "n=6"] and any("extension" in st for st in stages)
    assert 6 < res.runs_candidate <= 12 and res.runs_baseline == res.runs_candidate
    at_cap = next(s for s in res.stages if s["stage"] == "n=6")
    assert abs(at_cap["ratio_median"] - 1) < at_cap["margin"]  # extended though not "promising"


def test_wall_budget_stop_is_same_with_the_reason(endpoint, pool, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(experiment.time, "monotonic", lambda: clock[0])
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.02}), noise_cv=0.06)
    deploy = eng.deploy

    def slow_deploy(config, *, seed=0):
        clock[0] += 1.0  # every run costs one second of (fake) wall time
        return deploy(config, seed=seed)
    eng.deploy = slow_deploy
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(), budget=Budget(max_wall_s=0.0))
    assert res.verdict == "invalid" and "fewer than 2 valid runs" in res.invalid_reasons[0]
    clock[0] = 0.0
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=12,
                                                            max_wall_s=8.5), noise_cv=0.005)
    assert len(res.runs) == 9  # the 10th run would start after the budget
    assert res.verdict == "same" and "wall-time budget exhausted" in res.reason
    assert not res.stats.equivalence_shown


@pytest.mark.parametrize("faults, needle", [
    (Faults(crash_deploy=True), "crash: EngineError"),
    (Faults(crash_step=True), "crash: RuntimeError"),
    (Faults(lag=True), "client schedule lag"),
    (Faults(warmup_errors=True), "failed warm-up"),
])
def test_candidate_faults_make_runs_and_then_the_experiment_invalid(endpoint, pool, faults, needle):
    eng = FakeEngine(cap_of({}), faults_of=lambda c: faults if c.get("schedule_policy") == "lpm" else Faults())
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(max_invalid_per_arm=2))
    assert res.verdict == "invalid"
    bad = [r for r in res.runs if not r.valid]
    assert len(bad) == 3 and all(r.arm == "candidate" for r in bad)
    assert any(needle in x for x in res.invalid_reasons), res.invalid_reasons
    assert all(any(needle in x for x in r.invalid_reasons) for r in bad)


def test_config_drift_is_invalid_at_once(endpoint, pool):
    eng = FakeEngine(cap_of({}), faults_of=lambda c: Faults(drift={"chunked_prefill_size": 4096})
                     if c.get("chunked_prefill_size") == 2048 else Faults())
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "fcfs", "chunked_prefill_size": 2048},
                         pool, engine=eng, settings=settings())
    assert res.verdict == "invalid" and len(res.runs) == 2
    assert "config drift: chunked_prefill_size resolved to 4096, requested 2048" in res.invalid_reasons


def test_one_crash_is_retried_and_does_not_count(endpoint, pool):
    crashed = []

    def faults(c):
        if c.get("schedule_policy") == "lpm" and not crashed:
            crashed.append(1)
            return Faults(crash_deploy=True)
        return Faults()
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 0.7}), faults_of=faults, noise_cv=0.01)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings())
    assert res.verdict == "worse" and len(res.runs) == 11 and res.runs_candidate == 5


def test_lossy_candidate_runs_the_correctness_gate_first(endpoint, pool, monkeypatch):
    import autoresearch_dagster.correctness as correctness

    calls = []

    class Gate:
        def __init__(self, passed):
            self.passed = passed

        def to_dict(self):
            return {"passed": self.passed, "kl_mean": 0.5, "reasons": ["kl too high"] if not self.passed else []}

    monkeypatch.setattr(correctness, "emulated_gate", lambda b, c, seed=0, **kw: calls.append((b, c)) or Gate(False))
    eng = FakeEngine(cap_of({}))
    eng.name = "emulator"
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "fcfs", "kv_cache_dtype": "fp8_e4m3"},
                         pool, engine=eng, settings=settings())
    assert res.lossy and res.verdict == "invalid" and res.runs == []
    assert calls and res.correctness["passed"] is False and "kl too high" in res.invalid_reasons[0]
    monkeypatch.setattr(correctness, "emulated_gate", lambda b, c, seed=0, **kw: Gate(True))
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "fcfs", "kv_cache_dtype": "fp8_e4m3"},
                         pool, engine=eng, settings=settings(), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=3))
    assert res.verdict in ("same", "better", "worse") and res.correctness["passed"] is True and res.runs


def test_noise_measurement_and_campaign_reuse(endpoint, pool, tmp_path):
    lake = open_lake(tmp_path / "lake")
    eng = FakeEngine(cap_of({}), noise_cv=0.03)
    camp = start_campaign(endpoint, pool, results=lake)
    assert start_campaign(endpoint, pool, results=lake).campaign_id == camp.campaign_id
    other = endpoint.model_copy(update={"sla": endpoint.sla.parse("ttft_p99<=500ms")})
    assert start_campaign(other, pool, results=lake).campaign_id != camp.campaign_id
    res = measure_noise(endpoint, endpoint.server_config, pool, engine=eng, runs=5, results=lake,
                        settings=settings(), campaign=camp)
    d = res.to_dict()
    assert d["runs"] == 5 and len(d["capacities"]) == 5 and 0.0 < d["capacity_cv"] < 0.15
    assert d["ci_low"] <= d["median"] <= d["ci_high"]
    assert d["reference_rps"] == pytest.approx(0.8 * res.runs[0].capacity_rps)
    assert "ttft_p99_ms" in d["latency_spread"]
    json.dumps(d)
    row = lake.query("SELECT runs, capacity_cv, engine_version FROM noise")[0]
    assert row[0] == 5 and row[1] == pytest.approx(d["capacity_cv"]) and row[2] == "fake-1.0"
    with pytest.raises(ValueError, match="at least 5"):
        measure_noise(endpoint, {}, pool, engine=eng, runs=3)


def test_ablation_says_which_change_carries_the_gain(endpoint, pool):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.25}), noise_cv=0.01)
    res = run_ablation(endpoint, endpoint.server_config,
                       {"policy": {"schedule_policy": "lpm"}, "chunk": {"chunked_prefill_size": 4096}},
                       pool, engine=eng, settings=settings(confirm=False), noise_cv=0.002,
                       budget=Budget(initial_runs_per_arm=4, max_runs_per_arm=4))
    assert res.combined.verdict == "better"
    assert res.attribution["policy"]["role"] == "carries gain"
    assert res.attribution["chunk"]["role"] == "no effect"
    assert "gain carried by: policy" in res.summary
    assert res.combined.kind == "ablation:combined" and res.leave_outs["chunk"].parent_id == res.combined.parent_id


def test_external_engine_is_refused_for_experiments(endpoint, pool):
    eng = FakeEngine(cap_of({}))
    eng.restartable = False
    with pytest.raises(EngineError, match="baselines only"):
        run_experiment(endpoint, {}, {"schedule_policy": "lpm"}, pool, engine=eng)


def test_promising_undecided_at_the_cap_gets_fresh_runs(endpoint, pool):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.08}), noise_cv=0.05)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=6),
                         noise_cv=0.005)
    stages = [s["stage"] for s in res.stages]
    assert stages[:2] == ["n=3", "n=6"] and res.stages[1]["verdict"] == "undecided"
    assert abs(res.stages[1]["ratio_median"] - 1) >= res.stages[1]["margin"]
    assert "confirmation: pooled" in stages
    assert len([r for r in res.runs if r.purpose == "confirmation"]) == 6
    assert res.verdict in ("better", "same") and (res.verdict == "better") == res.confirmed


def test_mode_both_confirms_on_the_production_shape_replay(endpoint, pool):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 1.25}), noise_cv=0.01)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(mode="both"), noise_cv=0.01)
    assert res.verdict == "better" and res.confirmed, res.reason
    shape_stage = [s for s in res.stages if s["stage"] == "confirmation: production shape"]
    assert shape_stage and shape_stage[0]["metric"] == "replay_capacity" and shape_stage[0]["ratio_median"] > 1.1
    conf = [r for r in res.runs if r.purpose == "confirmation"]
    assert all(r.replay_capacity and r.capacity_rps for r in conf)
    assert all(r.replay_capacity is None for r in res.runs if r.purpose == "experiment")


def test_real_emulator_runs_record_steps_and_catch_drift(endpoint, pool, tmp_path):
    """The emulator engine end to end through the harness, with drift injected into its server_info."""
    from autoresearch_dagster.engines import make_engine

    ep = endpoint.model_copy(update={"model": "gemma-moe-26b-a4b", "hardware": endpoint.hardware.model_copy(
        update={"count": 1}), "sla": endpoint.sla.parse("ttft_p99<=3000ms,tpot_p99<=60ms")})
    emu = make_engine(ep)

    class Drifting:
        name, restartable = "emulator", True

        def deploy(self, config, *, seed=0):
            dep = emu.deploy(config, seed=seed)
            if config.get("chunked_prefill_size") == 2048:
                info = dep.server_info()
                dep.server_info = lambda: {**info, "chunked_prefill_size": 8192}
            return dep

        def version(self):
            return emu.version()

    lake = open_lake(tmp_path / "lake")
    small = HarnessSettings(capacity=CapacitySettings(step_duration_s=10, min_completed=10, warmup_s=0,
                                                      resolution=0.05, start_rps=2.0), warmup_requests=2)
    res = run_experiment(ep, {}, {"chunked_prefill_size": 2048}, pool, engine=Drifting(), results=lake,
                         settings=small)
    assert res.verdict == "invalid" and [r.arm for r in res.runs] == ["baseline", "candidate"]
    assert "config drift: chunked_prefill_size resolved to 8192, requested 2048" in res.invalid_reasons
    base = res.runs[0]
    assert base.valid and base.capacity_rps > 0 and base.engine_version.startswith("emulator")
    n_steps = lake.query("SELECT count(*) FROM load_steps WHERE run_id = ?", [base.run_id])[0][0]
    assert n_steps == len(base.steps) >= 3
    assert lake.query("SELECT verdict FROM experiments") == [("invalid",)]


@pytest.mark.parametrize("estimator, metric", [("interp", "capacity_interp_rps"), ("search", "capacity_rps")])
def test_the_verdict_statistic_follows_the_estimator_setting(endpoint, pool, estimator, metric):
    eng = FakeEngine(cap_of({("schedule_policy", "lpm"): 0.75}), noise_cv=0.01)
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=eng,
                         settings=settings(estimator=estimator))
    assert res.verdict == "worse" and res.metric == metric
    assert res.stages and all(s["metric"] == metric and s["estimator"] == estimator for s in res.stages)
    runs = [r for r in res.runs if r.valid]
    assert all(r.capacity_interp_rps is not None for r in runs)
    # the crossing lies inside the search's last bracket: at or above the confirmed pass, within 2%
    assert all(r.capacity_rps <= r.capacity_interp_rps <= 1.02 * r.capacity_rps for r in runs)
    assert res.values("baseline") == [r.value(metric) for r in runs if r.arm == "baseline"]


def _scripted(values: dict[tuple[str, str], list[float]]):
    """A run source replaying given capacities per (arm, purpose), in order."""
    queues = {k: list(v) for k, v in values.items()}

    def source(arm, config, *, purpose, mode, run_index, seed, capacity_start=None):
        cap = queues[(arm, purpose)].pop(0)
        return RunRecord(run_id=f"r{run_index}", arm=arm, run_index=run_index, seed=seed, purpose=purpose,
                                 config=dict(config), config_hash="h", valid=True, invalid_reasons=[],
                                 capacity_rps=cap, capacity_interp_rps=cap)
    return source


def test_an_unconfirmed_early_better_continues_to_the_next_stage(endpoint, pool):
    # n=3 says better; the fresh confirmation runs point the other way, which is not the end before the cap:
    # the next stage adds runs, the pooled evidence says better again and new fresh runs confirm it
    source = _scripted({
        ("baseline", "experiment"): [10.0, 10.05, 9.95] * 4,
        ("candidate", "experiment"): [11.0, 11.05, 10.95] * 4,
        ("baseline", "confirmation"): [10.0, 10.01, 9.99, 10.0, 10.01, 9.99],
        ("candidate", "confirmation"): [9.9, 9.91, 9.89, 11.0, 11.01, 10.99],
    })
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=None,
                         settings=settings(), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=12),
                         noise_cv=0.005, run_source=source)
    stages = [(s["stage"], s["verdict"]) for s in res.stages]
    assert stages[:2] == [("n=3", "better"), ("confirmation: pooled", "undecided")]
    assert ("n=6", "better") in stages or ("n=12", "better") in stages  # the schedule went on after n=3
    assert [s for s, _ in stages].count("confirmation: pooled") == 2
    assert stages[-1] == ("confirmation: pooled", "better")
    assert res.verdict == "better" and res.confirmed
    assert len([r for r in res.runs if r.purpose == "confirmation"]) == 12  # two rounds of 3 fresh runs per arm


def test_an_unconfirmed_better_at_the_cap_is_same_with_the_reason(endpoint, pool):
    source = _scripted({
        ("baseline", "experiment"): [10.0, 10.05, 9.95],
        ("candidate", "experiment"): [11.0, 11.05, 10.95],
        ("baseline", "confirmation"): [10.0, 10.01, 9.99],
        ("candidate", "confirmation"): [9.9, 9.91, 9.89],
    })
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=None,
                         settings=settings(), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=3),
                         noise_cv=0.005, run_source=source)
    assert res.verdict == "same" and not res.confirmed
    assert "better not confirmed" in res.reason and "do not repeat the direction" in res.reason
    assert res.stages[-1]["stage"] == "stopped" and not res.stats.equivalence_shown


def test_same_within_a_noise_inflated_margin_is_not_final_before_the_cap(endpoint, pool):
    # a 5% run-level CV makes the n=3 noise floor (and so the margin) far wider than the practical 2%:
    # "same within ±8%" is no equivalence claim, so the schedule goes on; at the cap it is accepted
    source = _scripted({
        ("baseline", "experiment"): [10.0, 10.1, 9.9] * 2,
        ("candidate", "experiment"): [10.05, 9.95, 10.0] * 2,
    })
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "lpm"}, pool, engine=None,
                         settings=settings(), budget=Budget(initial_runs_per_arm=3, max_runs_per_arm=6),
                         noise_cv=0.05, run_source=source)
    stages = [(s["stage"], s["verdict"]) for s in res.stages]
    assert stages == [("n=3", "same"), ("n=6", "same")]
    assert res.stages[0]["margin"] > 0.02 and res.runs_baseline == res.runs_candidate == 6
    assert res.verdict == "same"


def test_drift_raised_by_the_engine_while_deploying_is_fatal_not_retried(endpoint, pool):
    # the sglang and modal engines refuse a drifted deployment themselves (ConfigDriftError); a redeploy
    # drifts again, so the experiment is invalid at once instead of retrying up to the invalid-run limit
    from autoresearch_dagster.engines.base import ConfigDriftError

    class DriftingEngine(FakeEngine):
        def deploy(self, config, *, seed=0):
            if config.get("chunked_prefill_size") == 2048:
                raise ConfigDriftError(["config drift: chunked_prefill_size resolved to 4096, requested 2048"])
            return super().deploy(config, seed=seed)

    eng = DriftingEngine(cap_of({}))
    res = run_experiment(endpoint, endpoint.server_config, {"schedule_policy": "fcfs", "chunked_prefill_size": 2048},
                         pool, engine=eng, settings=settings())
    assert res.verdict == "invalid" and len(res.runs) == 2
    assert "config drift: chunked_prefill_size resolved to 4096, requested 2048" in res.invalid_reasons
