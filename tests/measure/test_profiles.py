"""Named measurement profiles: one set, selected by name, fields overridden on top."""
import pytest

from autoresearch_dagster.measure.profiles import PROFILES, REQUEST_TIMEOUT_S, CapacitySettings, measurement_profile
from autoresearch_dagster.spec import SpecError


def test_profiles_share_the_one_request_timeout_and_differ_where_documented():
    assert set(PROFILES) == {"standard", "quick", "short"}
    assert {p.capacity.request_timeout_s for p in PROFILES.values()} == {REQUEST_TIMEOUT_S}
    standard, quick, short = (measurement_profile(n) for n in ("standard", "quick", "short"))
    assert standard.capacity == CapacitySettings()
    # make run's profile: the standard steps held to steady state, fewer runs, the quick diagnosis
    assert quick.capacity == CapacitySettings(hold_e2e_multiple=10.0)
    assert (quick.initial_runs_per_arm, quick.max_runs_per_arm, quick.quick_diagnosis) == (5, 5, True)
    assert (standard.max_runs_per_arm, standard.quick_diagnosis) == (20, False)
    assert short.capacity.step_duration_s < standard.capacity.step_duration_s and short.quick_diagnosis


def test_overrides_replace_fields_and_leave_the_named_profile_alone():
    p = measurement_profile("quick").with_overrides(step_duration_s=90.0, min_completed=None, max_runs_per_arm=10)
    assert p.capacity.step_duration_s == 90.0 and p.capacity.min_completed == 100  # None: not given
    assert p.capacity.hold_e2e_multiple == 10.0 and p.max_runs_per_arm == 10
    measurement_profile("standard").capacity.step_duration_s = 1.0  # callers get their own settings
    assert PROFILES["standard"].capacity.step_duration_s == 60.0
    with pytest.raises(SpecError, match="unknown measurement setting"):
        measurement_profile("standard").with_overrides(warp=2)
    with pytest.raises(SpecError, match="unknown measurement profile"):
        measurement_profile("fast")
