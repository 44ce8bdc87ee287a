"""Recipe files: every built-in one loads, relative moves resolve against the baseline, bad files fail clearly."""
import pytest

from autoresearch_dagster.agents.proposal import DIRECTIONS
from autoresearch_dagster.agents.recipes import load_recipes, relative_value, resolve_move
from autoresearch_dagster.spec import SpecError


def test_every_direction_has_recipes_and_every_recipe_loads():
    recipes = load_recipes()
    assert {r.direction for r in recipes} == set(DIRECTIONS)
    assert all(r.explanation and r.falsification and r.moves for r in recipes)


def test_relative_values_follow_search_values_and_bounds():
    assert relative_value("prefill_decode_interval", "next_up", 0) == 2
    assert relative_value("prefill_decode_interval", "next_down", 0) is None
    assert relative_value("chunked_prefill_size", "half", 8192) == 4096
    assert relative_value("mem_fraction_static", "next_up", 0.906) == 0.92
    assert relative_value("max_running_requests", "double", 8192) is None  # already at the bound


def test_a_move_resolves_against_the_resolved_baseline():
    mixed = next(r for r in load_recipes() if r.name == "mixed_chunk_prefill")
    move = resolve_move(mixed, 2, {"chunked_prefill_size": 8192, "enable_mixed_chunk": False})
    assert move.delta == {"enable_mixed_chunk": True, "chunked_prefill_size": 4096}
    assert resolve_move(mixed, 0, {"enable_mixed_chunk": True}) is None  # nothing left to change


def test_extra_recipe_directories_extend_and_bad_recipes_fail(tmp_path):
    (tmp_path / "mine.yaml").write_text("name: mine\ndirection: speculative\naddresses: [decode_bound_small_batch]\n"
                                        "explanation: e\nfalsification: f\nmoves:\n  - {speculative_algorithm: NGRAM}\n")
    assert any(r.name == "mine" for r in load_recipes([tmp_path]))
    (tmp_path / "bad.yaml").write_text("name: bad\ndirection: speculative\naddresses: [nope]\n"
                                       "explanation: e\nfalsification: f\nmoves:\n  - {page_size: 3}\n")
    with pytest.raises(SpecError, match="unknown bottlenecks"):
        load_recipes([tmp_path])
    (tmp_path / "bad.yaml").write_text("name: bad\ndirection: speculative\naddresses: [decode_bound_small_batch]\n"
                                       "requires: {model_trait: sparkly}\n"
                                       "explanation: e\nfalsification: f\nmoves:\n  - {page_size: 16}\n")
    with pytest.raises(SpecError, match="unknown model_trait 'sparkly'; known: linear_attention"):
        load_recipes([tmp_path])
