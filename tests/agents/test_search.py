"""The knob search space and the TPE search over it."""
import random

from autoresearch_dagster.agents.search import SearchSpace, normalize, search, static_problem
from autoresearch_dagster.spec import config_hash


def test_the_full_space_derives_from_the_knob_table_and_fits_the_gpus():
    one, eight = SearchSpace.full(1), SearchSpace.full(8)
    assert "tp_size" not in one.choices and eight.choices["tp_size"] == (1, 2, 4, 8)
    assert one.choices["enable_mixed_chunk"] == (False, True)
    assert one.size > 10 ** 6  # the whole space, not a hand-picked grid


def test_around_keeps_numeric_values_within_the_step_of_the_resolved_value():
    space = SearchSpace.full(1).around(["max_running_requests", "enable_mixed_chunk"], {"max_running_requests": 256},
                                       max_step=2.0)
    assert set(space.choices) == {"max_running_requests", "enable_mixed_chunk"}
    assert set(space.choices["max_running_requests"]) == {None, 128, 256, 512}


def test_normalize_gives_one_hash_per_configuration():
    resolved = {"chunked_prefill_size": 8192, "schedule_policy": "fcfs"}
    a = normalize({"schedule_policy": "fcfs", "chunked_prefill_size": 8192, "speculative_num_steps": 3}, {}, resolved)
    assert a == {}
    assert normalize({"enable_mixed_chunk": False}, {"enable_mixed_chunk": True}) == {"enable_mixed_chunk": False}


def test_static_problems_are_known_without_an_engine():
    assert "exceeds" in static_problem({"tp_size": 2}, 1)
    assert "override" in static_problem({"speculative_algorithm": "NGRAM", "enable_mixed_chunk": True}, 1)
    assert static_problem({"tp_size": 2}, 2) is None


def test_search_evaluates_seeds_then_learns_and_never_asks_twice():
    space = SearchSpace({"prefill_decode_interval": (0, 2, 4, 8, 16), "enable_mixed_chunk": (False, True),
                         "page_size": (1, 16, 64)})
    seen = []

    def objective(configs):
        seen.extend(config_hash(c) for c in configs)
        # the best region: mixed chunks on with a moderate interval; page 64 is "infeasible"
        return [(None, "does not fit") if c.get("page_size") == 64 else
                (1.0 + 0.3 * bool(c.get("enable_mixed_chunk")) + 0.01 * c.get("prefill_decode_interval", 0), "")
                for c in configs]

    tpe = search(space, {}, objective, seeds=[({"enable_mixed_chunk": True}, "recipe#0")], history=[], n_trials=10,
                 batch=2, seed=1)
    assert tpe.trials[0].source == "seed" and len(seen) == len(set(seen))
    assert sum(t.value is None for t in tpe.trials) >= 1  # infeasible ones are recorded, not dropped
    best = max((t for t in tpe.trials if t.value), key=lambda t: t.value)
    assert best.config.get("enable_mixed_chunk") is True
    again = search(space, {}, objective, seeds=[({"enable_mixed_chunk": True}, "recipe#0")], history=[], n_trials=10,
                   batch=2, seed=1)
    assert [t.config for t in again.trials] == [t.config for t in tpe.trials]  # deterministic for a seed
    assert SearchSpace.full(1).sample(random.Random(0), {}) != SearchSpace.full(1).sample(random.Random(1), {})
