"""SLA strings are parsed strictly: units, '<=' only, '%' on the error rate, quantiles in (0, 100), no repeats.

Each bad string raises one SpecError line that names the term; a bad SLA in an endpoint spec reads as one
line too (the field, then the reason).
"""
import pytest

from autoresearch_dagster.spec import SLA, SLATerm, SpecError, load_endpoint


def test_good_strings_parse_and_round_trip():
    sla = SLA.parse("ttft_p99<=3000ms, tpot_p99 <= 0.06s,e2e_p99.9<=1e5ms,itl_p50<=20 ms,errors<=0.5%")
    assert [(t.metric, t.quantile, t.max_ms) for t in sla.terms] == [
        ("ttft", 99.0, 3000.0), ("tpot", 99.0, 60.0), ("e2e", 99.9, 1e5), ("itl", 50.0, 20.0)]
    assert sla.max_error_rate == 0.005
    assert SLA.parse(str(sla)) == sla
    assert SLA.parse("ttft_p99<=2s").max_error_rate == 0.01  # the default when no error term is given
    assert SLA.parse("ttft_p95<=1s,ttft_p99<=2s,errors<=0%").max_error_rate == 0.0  # two quantiles of one metric


@pytest.mark.parametrize("text, reason", [
    ("ttft_p99<=3", "SLA term 'ttft_p99<=3': the bound needs a unit, ms or s, e.g. '3ms' or '3s'"),
    ("ttft_p99<=3us", "needs a number and a unit, ms or s"),
    ("ttft_p99<3000ms", "only '<=' bounds are allowed, not '<'"),
    ("ttft_p99=3000ms", "only '<=' bounds are allowed, not '='"),
    ("ttft_p99>=3000ms", "only '<=' bounds are allowed, not '>='"),
    ("errors<1%,ttft_p99<=1s", "only '<=' bounds are allowed"),
    ("ttft_p99<=1s,errors<=1", "SLA term 'errors<=1': the error rate needs a percentage with '%'"),
    ("ttft_p99<=1s,errors<=0.01", "needs a percentage with '%'"),
    ("ttft_p99<=1s,errors<=150%", "an error rate is between 0% and 100%"),
    ("ttft_p0<=1s", "quantile p0 is outside (0, 100)"),
    ("ttft_p100<=1s", "quantile p100 is outside (0, 100)"),
    ("ttft_p100.5<=1s", "quantile p100.5 is outside (0, 100)"),
    ("ttft_p99<=1s,ttft_p99<=2s", "bounds ttft_p99 twice"),
    ("ttft_p99<=1s,ttft_p99.0<=2000ms", "bounds ttft_p99 twice"),
    ("ttft_p99<=1s,errors<=1%,errors<=2%", "bounds the error rate twice"),
    ("ttft_p99<=0ms", "a latency bound must be positive"),
    ("latency_p99<=1s", "unknown name 'latency_p99'"),
    ("ttft_p99", "has no bound"),
    ("ttft_p99<=1s,", "empty term"),
    ("errors<=1%", "at least one latency term"),
    ("", "comma-separated list of bounds"),
])
def test_each_bad_string_is_one_clear_line(text, reason):
    with pytest.raises(SpecError) as e:
        SLA.parse(text)
    msg = str(e.value)
    assert reason in msg and "\n" not in msg


def test_an_sla_built_from_terms_cannot_repeat_one():
    t = SLATerm(metric="ttft", quantile=99, max_ms=100)
    with pytest.raises(ValueError, match="more than one bound for ttft_p99"):
        SLA(terms=(t, t))


def test_a_bad_sla_in_an_endpoint_spec_is_one_line(tmp_path):
    spec = tmp_path / "ep.yaml"
    spec.write_text('name: e\nmodel: gemma-moe-26b-a4b\nhardware: {gpu: H200}\nsla: "ttft_p99<=3,errors<=1%"\n')
    with pytest.raises(SpecError) as e:
        load_endpoint(spec)
    assert str(e.value) == (f"endpoint spec {spec}: sla: SLA term 'ttft_p99<=3': the bound needs a unit, ms or s, "
                            "e.g. '3ms' or '3s'")
