"""outputs.plots: the one load-curve plot, with each run's capacity marker, the noise band, the SLA bounds
and the failed steps, drawn from step dicts and LoadStep objects alike."""
from matplotlib.lines import Line2D

from autoresearch_dagster.measure.step import LoadStep
from autoresearch_dagster.outputs.plots import load_curve_figure, plot_load_curve, plot_ratios
from autoresearch_dagster.spec import SLA

SLA_ = SLA.parse("ttft_p99<=500ms,itl_p99<=50ms")


def _step(rate: float, ttft_p99: float, *, passed: bool, kind: str = "capacity") -> dict:
    q = lambda v: {"p50": v / 3, "p95": v / 1.5, "p99": v}  # noqa: E731
    return {"step_id": f"s{rate}", "kind": kind, "rate_rps": rate, "offered_rps": rate, "achieved_rps": rate * 0.98,
            "goodput_rps": rate * (0.95 if passed else 0.5), "ttft_ms": q(ttft_p99), "tpot_ms": q(20.0),
            "itl_ms": q(30.0), "e2e_ms": q(900.0), "passed": passed}


STEPS = [_step(0.5, 100, passed=True, kind="warmup"), _step(1.0, 120, passed=True),
         _step(2.0, 300, passed=True), _step(4.0, 2000, passed=False)]


def _capacity_lines(fig) -> list[Line2D]:
    return [ln for ax in fig.axes for ln in ax.lines if ln.get_color() == "green" and ln.get_linestyle() == "--"]


def test_the_capacity_marker_is_a_vertical_line_at_the_capacity_on_every_panel():
    fig = load_curve_figure([(STEPS, 2.5)], sla=SLA_)
    # TTFT, TPOT, the SLA's ITL, throughput
    assert [ax.get_ylabel() for ax in fig.axes] == ["TTFT (ms)", "TPOT (ms)", "ITL (ms)", "requests/s"]
    lines = _capacity_lines(fig)
    assert len(lines) == len(fig.axes) and all(list(ln.get_xdata()) == [2.5, 2.5] for ln in lines)
    assert lines[0].get_label() == "capacity 2.5"
    ttft = fig.axes[0]
    assert any(list(ln.get_ydata()) == [500, 500] and ln.get_label().startswith("SLA ttft") for ln in ttft.lines)
    p99 = next(ln for ln in ttft.lines if ln.get_label() == "p99")
    assert list(p99.get_xdata()) == [1.0, 2.0, 4.0]  # warm-up left out, sorted by rate
    assert ttft.get_yscale() == "log"


def test_the_noise_band_and_every_runs_capacity_are_drawn_and_failed_steps_shaded():
    runs = [(STEPS, 2.5), ([_step(1.0, 150, passed=True), _step(3.0, 400, passed=True)], 3.0)]
    fig = load_curve_figure(runs, sla=SLA_, band=(2.4, 3.1))
    xs = sorted({ln.get_xdata()[0] for ln in _capacity_lines(fig)})
    assert xs == [2.5, 3.0]
    ttft = fig.axes[0]
    band = [p for p in ttft.patches if p.get_label().startswith("noise band")]
    assert len(band) == 1
    x0, x1 = band[0].get_x(), band[0].get_x() + band[0].get_width()
    assert (x0, x1) == (2.4, 3.1)
    failed = [p for p in ttft.patches if p.get_facecolor()[:3] == (1.0, 0.0, 0.0)]
    assert len(failed) == 1 and failed[0].get_x() < 4.0 < failed[0].get_x() + failed[0].get_width()


def test_no_band_without_both_ends_and_no_marker_without_a_capacity():
    fig = load_curve_figure([(STEPS, None)], sla=SLA_, band=(None, None))
    assert not _capacity_lines(fig)
    assert not [p for p in fig.axes[0].patches if p.get_label().startswith("noise band")]


def test_load_steps_objects_and_a_png_on_disk(tmp_path):
    step = LoadStep(step_id="c1", rate_rps=2.0, offered_rps=2.0, achieved_rps=1.9, n_sent=10, n_ok=10, n_failed=0,
                    n_timeout=0, ttft_ms={"p50": 50.0, "p95": 80.0, "p99": 90.0}, itl_ms={"p50": 5.0, "p95": 6.0, "p99": 7.0},
                    tpot_ms={"p50": 5.0, "p95": 6.0, "p99": 7.0}, e2e_ms={"p50": 500.0, "p95": 600.0, "p99": 700.0},
                    error_rate=0.0, goodput_rps=1.9, meets_sla=True, failed_terms=[], queue_growth=False, valid=True,
                    invalid_reasons=[])
    path = plot_load_curve([([step], 2.0)], tmp_path / "curve.png", sla=SLA_, speedup=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_ratio_plot_writes_a_png(tmp_path):
    verdicts = [{"candidate_id": "a", "ratio_median": 1.1, "ci_low": 1.05, "ci_high": 1.2, "margin": 0.03,
                 "verdict": "improved"},
                {"candidate_id": "b", "ratio_median": None, "verdict": "invalid", "invalid_reasons": ["crash; x"]}]
    path = plot_ratios(verdicts, tmp_path / "ratios.png", title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"
