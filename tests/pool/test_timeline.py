"""logs.timeline: the gate that keeps a pool's timeline within its span and gap limits, in file order."""
import numpy as np
import pytest

from autoresearch_dagster.logs import Rejected, TimelineGate, TimelineLimits
from autoresearch_dagster.spec import SpecError

DAY = 86400.0
T0 = 1714000000.0  # 2024-04-24


def _run(stamps, limits=None, chunks=None):
    """(admitted timestamps in emit order, {index: reason}); ``chunks`` pushes the rows as batches of that size."""
    admitted, rejected = [], {}

    def emit(item, keep):
        rows = item if isinstance(item, list) else [item]
        admitted.extend(r for r, k in zip(rows, keep if keep is not None else [True] * len(rows)) if k)

    gate = TimelineGate(limits, emit, lambda r: rejected.__setitem__(r.line, r.reason))
    if chunks:
        for i in range(0, len(stamps), chunks):
            part = stamps[i:i + chunks]
            gate.push_many(np.array(part, np.float64), np.arange(i, i + len(part)), np.ones(len(part), int),
                           [(i + j, t) for j, t in enumerate(part)])
    else:
        for i, t in enumerate(stamps):
            gate.push_one(t, i, 1, (i, t))
    gate.finish()
    return [t for _, t in admitted], rejected


def test_far_outliers_are_quarantined_with_the_value_and_the_limit():
    stamps = [T0 + i for i in range(2000)]
    stamps[0] = 1e300  # the very first record
    stamps[5] = 4083235200.0  # 2099
    stamps[1500] = 4083235200.0  # after the probe
    stamps[1600] = 0.0
    kept, rejected = _run(stamps)
    assert set(rejected) == {0, 5, 1500, 1600}
    assert min(kept) == T0 + 1 and max(kept) == T0 + 1999
    assert rejected[5].startswith("timestamp outlier: 4083235200 (2099-05-23 16:00:00 UTC) is ")
    assert "after the timeline so far" in rejected[5] and "the largest gap allowed is 7 days" in rejected[5]
    assert "1e+300" in rejected[0] and "before the timeline so far" in rejected[1600]


def test_an_outlier_among_the_first_records_does_not_start_the_timeline():
    stamps = [T0 - 20 * DAY] + [T0 + 60 * i for i in range(50)]  # fewer records than the probe: decided at finish
    kept, rejected = _run(stamps)
    assert list(rejected) == [0] and "20 days before" in rejected[0]
    assert kept == stamps[1:]


def test_span_and_gap_limits():
    limits = TimelineLimits(max_span_s=1000.0, max_gap_s=100.0, probe_records=5)
    stamps = [0, 10, 20, 30, 40, 120, 300, 200, 290, 390, 480, 570, 660, 750, 840, 930, 1020, 1100]
    kept, rejected = _run(stamps, limits)
    assert "after the timeline so far" in rejected[6]  # 300: 180 s after 120
    assert 16 in rejected and rejected[16].startswith("timestamp beyond the span limit: 1020 would make the timeline "
                                                      "span 1020 s")
    assert "the longest span allowed is 1000 s" in rejected[16]
    assert 17 in rejected  # 1100: the timeline stays 0 .. 930
    assert max(kept) - min(kept) <= 1000.0
    ordered = sorted(kept)
    assert max(np.diff(ordered)) <= 100.0


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_batches_decide_exactly_as_single_records(chunk):
    rng = np.random.default_rng(5)
    stamps = list(np.cumsum(rng.exponential(300.0, 3000)) + T0)
    for i in rng.choice(3000, 25, replace=False):
        stamps[i] = float(stamps[i] + rng.choice([-1, 1]) * rng.uniform(8, 400) * DAY)
    limits = TimelineLimits(max_span_s=5 * DAY, max_gap_s=0.5 * DAY, probe_records=101)
    one = _run(stamps, limits)
    many = _run(stamps, limits, chunks=chunk)
    assert one == many
    assert len(one[1]) >= 25


def test_limits_are_validated():
    with pytest.raises(SpecError, match="cannot exceed"):
        TimelineLimits(max_span_s=10.0, max_gap_s=20.0)
    with pytest.raises(SpecError, match="positive"):
        TimelineLimits(max_span_s=float("nan"))
    assert isinstance(Rejected(1, "x", 1), Rejected)
