"""Production-shape replay: the speed-up search and per-interval attainment."""
import numpy as np
import pytest

from autoresearch_dagster.measure.shape import run_shape
from autoresearch_dagster.spec import SLA

from ..loadgen.helpers import FakePool, FakePoolRequest
from .helpers import KneeDeployment

SLA_SPEC = SLA.parse("ttft_p99<=500ms,tpot_p99<=50ms,errors<=1%")


def test_shape_replay_search_and_per_interval_attainment():
    rng = np.random.default_rng(0)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 60, 60), rng.uniform(60, 120, 240), rng.uniform(120, 180, 60)]))
    arrivals[0] = 0.0
    pool = FakePool([FakePoolRequest(id=f"r{i}", arrival_s=float(a), messages=[{"role": "user", "content": "x"}],
                                     output_tokens=10) for i, a in enumerate(arrivals)])
    dep = KneeDeployment(knee=12.0)  # the peak interval offers 4 req/s at x1: fails above ~x3 (12 req/s)
    res = run_shape(dep, pool, SLA_SPEC, gpus=1, model="m", search=True, interval_s=60.0, resolution=0.05)
    # the whole-schedule rate (360 req over 180/x s) is 2x per speed-up: knee at x6 by the deployment's reading
    assert res.replay_capacity == pytest.approx(6.0, rel=0.08)
    assert res.valid and res.speedup == res.replay_capacity
    assert [i["sent"] for i in res.intervals] == [60, 240, 60]
    assert res.intervals[1]["target_rps"] == pytest.approx(4.0 * res.speedup)
    assert all(i["attainment"] == 1.0 for i in res.intervals)
    assert res.autoscaling is None  # no replicas timeseries: reported as absent, not invented
    one = run_shape(dep, pool, SLA_SPEC, gpus=1, model="m", speedup=20.0, interval_s=60.0)
    assert one.replay_capacity is None and not one.meets_sla and all(i["meets_sla"] is False for i in one.intervals)
