"""A campaign's lifecycle on the emulator: engine upgrades during and after a campaign, a rebuilt pool, and the
ablation of a promotion that changes several knobs of one direction."""
import json

from autoresearch_dagster.agents.proposal import Proposal, Session
from autoresearch_dagster.campaign.report import best_era
from autoresearch_dagster.engines.emulator import EmulatorEngine

from ..agents.helpers import long_prompt_pool, small_endpoint
from .helpers import TINY, runner, settings


class Versioned(EmulatorEngine):
    """The emulator reporting a chosen engine version (an upgraded engine, as the engine_version asset sees it)."""

    def __init__(self, endpoint, version: str):
        super().__init__(endpoint)
        self._reported = version

    def version(self) -> str:
        return self._reported


def endpoint(**server_config):
    return small_endpoint(engine_options={"hidden_factors_seed": 5}, server_config=server_config)


def control_ids(r, era) -> set[str]:
    return {run.run_id for run in r.control_runs(era)}


def test_an_engine_bump_mid_campaign_opens_an_era_with_its_own_control(tmp_path):
    ep = endpoint()
    first = runner(tmp_path, endpoint=ep, engine=Versioned(ep, "1.0"))
    first.measure()
    first.diagnose()
    plan = first.plan()
    old = control_ids(first, first.state.era)
    assert old and first.state.era.engine_version == "1.0" and plan.proposals
    # the next step runs in a process whose engine reports a new version: the campaign goes on in a new era
    again = runner(tmp_path, endpoint=ep, engine=Versioned(ep, "1.1"))
    assert again.state.campaign_id == first.state.campaign_id and again.running
    rec = again.run_proposal(plan, plan.proposals[0])  # the old version's round: not measured on the new one
    assert not rec["ran"] and rec["verdict"] == "invalid" and "engine" in rec["reason"]
    assert again.plan() is None and again.running  # no round on the old version's control
    assert again.state.rounds[-1]["status"] == "abandoned"
    era = again.measure()
    assert era.index == 1 and era.reason == "engine_bump" and era.engine_version == "1.1"
    assert era.config_hash == first.state.era.config_hash and era.noise and again.state.phase == "diagnose"
    new = control_ids(again, era)
    assert len(new) == era.noise["runs"] and not new & old  # its own control, nothing pooled across versions
    assert control_ids(again, again.state.eras[0]) == old  # the old version's control is left as it was
    assert era.replication is None  # the same config re-measured: no promotion to replicate
    bump = again.state.decisions[-1]["engine_bump"]
    assert bump == {"from": "1.0", "to": "1.1"}
    # measured again on the same version: nothing new is opened or measured
    same = runner(tmp_path, endpoint=ep, engine=Versioned(ep, "1.1"))
    assert same.measure().index == 1 and control_ids(same, same.state.era) == new


class WithInert:
    """One admission idea of two knobs: twice the running requests of the baseline (a large gain) and the
    recurrent-state share of a hybrid model's memory, inert on this dense model."""
    name = "scripted"

    def propose(self, brief, tools):
        return Session(proposer=self.name, direction=brief.direction, proposals=[Proposal(
            id=f"admit-{brief.round}", endpoint=brief.endpoint, proposer=self.name, source="script",
            direction="parallel_admission", explanation="admit more requests, and split the cache memory otherwise",
            intervention={"changes": [{"knob": "max_running_requests", "value": 8},
                                      {"knob": "mamba_full_memory_ratio", "value": 0.5}]},
            prediction={"capacity_ratio": 1.3, "ratio_low": 1.1, "ratio_high": 1.5, "basis": "script"},
            falsification="refuted if not better")] if brief.round == 1 else [])


def one_round(r):
    r.measure()
    r.diagnose()
    plan = r.plan()
    assert plan is not None and [p.id for p in plan.proposals] == ["admit-1"]
    return plan, r.close(plan, r.run_round(plan))


def scripted(**budget):
    s = settings(**budget)
    s.directions_per_round, s.experiments_per_round, s.exploit = 1, 1, 0
    return s


# longer load steps than TINY's: an experiment's three candidate runs then measure one config alike whatever its seeds
STEADY = TINY.with_overrides(step_duration_s=60.0, min_completed=60)


def test_a_knob_that_adds_nothing_is_dropped_before_promotion_and_a_bump_after_the_end_starts_anew(tmp_path):
    ep = endpoint(max_running_requests=4)
    r = runner(tmp_path, endpoint=ep, engine=Versioned(ep, "1.0"), settings_=scripted(max_experiments=4),
               proposers=[WithInert()], measurement=STEADY)
    plan, decision = one_round(r)
    full = next(e for e in r.state.experiments if e["proposal_id"] == "admit-1")
    assert full["verdict"] == "better", full["reason"]
    ab = decision["ablation"]
    by_knob = {v["without"]: v for v in ab["variants"]}
    assert set(by_knob) == {"max_running_requests", "mamba_full_memory_ratio"}
    # without the inert knob the candidate is not worse than the full set; without more running requests it is
    inert = by_knob["mamba_full_memory_ratio"]
    assert inert["within_margin"] and inert["verdict"] == "better"
    assert by_knob["max_running_requests"]["vs_full"]["verdict"] == "worse"
    assert ab["dropped"] == ["mamba_full_memory_ratio"] and ab["promoted"] == {"max_running_requests": 8}
    assert decision["promote"] and decision["config"] == {"max_running_requests": 8}
    assert decision["experiment_id"] == by_knob["mamba_full_memory_ratio"]["experiment_id"]
    # the ablation's runs count against the budget and are recorded in the round and the promoted era
    assert r.state.spent["experiments"] == 1 + len(ab["variants"])
    assert r.state.rounds[-1]["decision"]["ablation"] == ab
    era = r.set_baseline(decision["config"], experiment_id=decision["experiment_id"])
    assert era.delta == {"max_running_requests": 8} and era.ablation == ab
    r.measure()  # the promotion's noise floor (and its replication)
    report = r.finish()
    assert r.state.status == "ended" and report["engine_version"] == "1.0"
    ended = r.state
    # reopened on the same version: the ended campaign stays as it is
    assert runner(tmp_path, endpoint=ep, engine=Versioned(ep, "1.0")).state.campaign_id == ended.campaign_id
    # after the end the engine reports a new version: a new campaign (its id names the version) from the best config
    bumped = runner(tmp_path, endpoint=ep, engine=Versioned(ep, "2.0"))
    st = bumped.state
    assert st.campaign_id != ended.campaign_id and bumped.running and st.engine_version == "2.0"
    assert best_era(ended).index == 1  # the promotion replicated: it is the config the new campaign starts from
    assert st.original.config == {"max_running_requests": 8} and st.original.engine_version == "2.0"
    assert st.previous["campaign_id"] == ended.campaign_id and st.previous["why"].startswith("engine_bump")
    archive = tmp_path / "campaign" / "archive"
    kept = json.loads(next(archive.glob(f"{ended.campaign_id}.*/state.json")).read_text())
    assert kept["campaign_id"] == ended.campaign_id and kept["status"] == "ended"
    assert not (tmp_path / "campaign" / "eras").exists() and not (tmp_path / "campaign" / "rounds").exists()
    assert bumped.results.query(f"SELECT engine_version FROM campaigns WHERE campaign_id = '{st.campaign_id}'") \
        == [("2.0",)]


def test_a_rebuilt_pool_is_a_new_start_that_reuses_no_run_of_the_old_pool(tmp_path):
    ep = endpoint(max_running_requests=4)
    old = runner(tmp_path, endpoint=ep, pool=long_prompt_pool(tmp_path / "a"), settings_=scripted(max_experiments=1),
                 proposers=[WithInert()])
    plan, decision = one_round(old)
    rec = next(e for e in old.state.experiments if e["proposal_id"] == "admit-1")
    # an ablation the budget has no room for is not run: the full set is promoted, the reason kept
    assert decision["promote"], decision["reason"]
    assert decision["ablation"]["variants"] == [] and "budget: 1 experiments" in decision["ablation"]["skipped"]
    assert decision["config"] == {"max_running_requests": 8, "mamba_full_memory_ratio": 0.5}
    assert "ablation incomplete" in decision["reason"] and old.state.spent["experiments"] == 1
    old_runs = control_ids(old, old.state.era)
    # the logs changed and the pool was rebuilt: another content hash, a new campaign from the spec's config
    # (nothing the old campaign promoted was confirmed)
    new = runner(tmp_path, endpoint=ep, pool=long_prompt_pool(tmp_path / "b", seed=4), settings_=scripted(),
                 proposers=[WithInert()])
    assert new.state.pool_hash != old.state.pool_hash and new.state.campaign_id != old.state.campaign_id
    assert new.state.phase == "measure" and new.control_runs() == [] and new.state.experiments == []
    assert new.state.previous["why"].startswith("pool rebuilt") and new.state.original.config == ep.server_config
    archived = next((tmp_path / "campaign" / "archive").glob(f"{old.state.campaign_id}.*"))
    assert (archived / "eras" / "00" / "control_runs.json").exists()
    assert (archived / "rounds" / "001" / "experiments" / "admit-1.json").exists()
    new.measure()
    assert control_ids(new, new.state.era) and not control_ids(new, new.state.era) & old_runs
    new.diagnose()
    plan2 = new.plan()
    # the same proposal in the same round: no experiment file says it "already ran" (run_proposal would reuse one)
    assert [p.id for p in plan2.proposals] == [rec["proposal_id"]] and plan2.round == rec["round"]
    assert not (tmp_path / "campaign" / "rounds" / "001" / "experiments" / "admit-1.json").exists()


class UpgradedAfter(EmulatorEngine):
    """The emulator upgraded under a running experiment: after ``upgrade(after)`` its next ``after`` deployments
    report the old version, every later one (and ``version()``) the spec's ``engine_options.release`` label."""

    def __init__(self, endpoint, release: str):
        super().__init__(endpoint)
        self._upgraded = endpoint.model_copy(update={"engine_options": {**endpoint.engine_options, "release": release}})
        self._left: int | None = None
        self.deploys = 0

    def upgrade(self, after: int) -> None:
        self._left = after

    def deploy(self, config, *, seed=0):
        if self._left is not None:
            if self._left <= 0:
                self.endpoint = self._upgraded
            self._left -= 1
        self.deploys += 1
        return super().deploy(config, seed=seed)


def test_an_engine_upgrade_during_an_experiment_makes_it_invalid_and_the_next_round_re_measures(tmp_path):
    ep = endpoint()
    engine = UpgradedAfter(ep, "2")
    s = settings(max_experiments=4)
    s.directions_per_round, s.experiments_per_round, s.exploit = 1, 1, 0
    r = runner(tmp_path, endpoint=ep, engine=engine, settings_=s)
    r.measure()
    r.diagnose()
    plan = r.plan()
    old_version, old_era = r.state.era.engine_version, r.state.era
    old = control_ids(r, old_era)
    assert plan is not None and len(plan.proposals) == 1 and old_era.noise["engine_version"] == old_version
    engine.upgrade(after=1)  # the experiment's first run measures the old version, its later runs the new one
    before = engine.deploys
    [rec] = r.run_round(plan)
    new_version = engine.version()
    assert new_version != old_version and new_version.endswith("+2")
    assert rec["ran"] and engine.deploys - before >= 2 and rec["verdict"] == "invalid"
    assert "engine version changed" in rec["invalid_reasons"]
    assert new_version in rec["reason"] and old_version in rec["reason"]
    assert rec["ratio_median"] is None or not rec["confirmed"]
    decision = r.close(plan, [rec])
    # nothing promoted; the round closes into the engine_bump era of the same config (no round on the old control)
    assert not decision["promote"] and decision["next"] == "measure" and r.running
    assert [e.reason for e in r.state.eras] == ["original", "engine_bump"] and r.state.phase == "measure"
    assert r.state.decisions[-1]["engine_bump"] == {"from": old_version, "to": new_version}
    assert r.state.experiments[-1]["verdict"] == "invalid"
    era = r.measure()
    assert era.index == old_era.index + 1 and era.reason == "engine_bump" and era.engine_version == new_version
    assert era.config_hash == old_era.config_hash and era.noise["engine_version"] == new_version
    new = control_ids(r, era)
    assert len(new) == era.noise["runs"] and not new & old  # its own control on the new version
    assert all(run.engine_version == new_version for run in r.control_runs(era))
    r.diagnose()
    nxt = r.plan()
    assert nxt is not None and nxt.round == plan.round + 1 and r.state.era.index == era.index
    [rec2] = r.run_round(nxt)
    assert rec2["era"] == era.index and "engine version changed" not in rec2["invalid_reasons"]


def test_an_engine_upgrade_while_the_noise_floor_is_measured_pools_nothing_and_measures_again(tmp_path):
    ep = endpoint()
    engine = UpgradedAfter(ep, "2")
    r = runner(tmp_path, endpoint=ep, engine=engine)
    old_version = r.state.era.engine_version
    engine.upgrade(after=2)  # two noise runs on the old version, every later one on the new
    era = r.measure()
    new_version = engine.version()
    assert new_version != old_version and r.running and era.index == 0
    assert era.engine_version == new_version and era.noise["engine_version"] == new_version
    runs = r.control_runs(era)
    assert len(runs) == era.noise["runs"] and {run.engine_version for run in runs} == {new_version}
    # the first, mixed attempt's runs are in the lake with their own versions, none of them in the floor
    versions = {v for (v,) in r.results.query("SELECT DISTINCT engine_version FROM runs")}
    assert versions == {old_version, new_version}
