"""The example autoscaled endpoint (examples/endpoints/demo-autoscaled.yaml) through a real in-process Dagster run: its
replay pool, then the replay_vs_production check on noise_baseline, whose production replay runs on the emulated
fleet and shows the autoscaling report in the UI (GPU-seconds, replicas, scale-up latency, SLA misses in bursts,
the plot) and writes its autoscaling lake row."""
from pathlib import Path

import dagster as dg

from autoresearch_dagster.results import ResultsLake
from jobs.instance import execute
from .conftest import ROOT, make_defs
from .test_dagster_replay_production import CHECK, LINES, POOL, check_evaluation


def test_the_autoscaled_example_shows_its_fleet_in_the_replay_check(tmp_path, instance):
    logs = tmp_path / "logs"
    logs.mkdir()
    head = (ROOT / "examples/logs/demo_chat.jsonl").read_text().splitlines(keepends=True)[:LINES]
    (logs / "chat.jsonl").write_text("".join(head))
    (tmp_path / "endpoints").mkdir()
    (tmp_path / "candidates").mkdir()
    text = (ROOT / "examples/endpoints/demo-autoscaled.yaml").read_text()
    assert "logs: [../logs/demo_chat.jsonl]" in text
    (tmp_path / "endpoints" / "demo-autoscaled.yaml").write_text(
        text.replace("logs: [../logs/demo_chat.jsonl]", f"logs: [{logs / 'chat.jsonl'}]"))
    defs = make_defs(tmp_path)
    instance.add_dynamic_partitions("endpoints", ["demo-autoscaled"])
    assert execute(defs, instance, "demo-autoscaled", [POOL]).success
    result = execute(defs, instance, "demo-autoscaled", [], checks=[CHECK], raise_on_error=False)
    md = check_evaluation(result).metadata
    gpu_s, mean = md["autoscaling/gpu_seconds"].value, md["autoscaling/mean_replicas"].value
    assert gpu_s > 0 and 1.0 <= mean <= 4.0  # the spec's min and max replicas, one GPU each
    assert md["autoscaling/replicas_max"].value >= 2 and md["autoscaling/scale_ups"].value >= 1
    assert md["autoscaling/scale_up_latency_median_s"].value >= 30.0  # at least the spec's 30 s cold start
    assert 0 <= md["autoscaling/burst_sla_misses"].value <= md["autoscaling/burst_requests"].value
    plot = Path(md["autoscaling/plot"].value)
    assert plot.name == "autoscaling.png" and plot.stat().st_size > 10_000
    assert "GPU-seconds" in md["autoscaling/report"].value and "data:image/png;base64" in md["autoscaling/report"].value
    lake = ResultsLake(tmp_path / "out" / "lake")
    (row,) = lake.query("SELECT role, replay, gpu_seconds, scale_ups FROM autoscaling "
                        "WHERE endpoint = 'demo-autoscaled'")
    assert row[:2] == ("production", "production") and row[2] == gpu_s
    assert isinstance(md["autoscaling/report"], dg.MarkdownMetadataValue)
