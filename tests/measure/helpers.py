"""Deployments with a known answer for the measurement tests."""
from autoresearch_dagster.loadgen.records import RequestRecord, StepOutcome


class KneeDeployment:
    """Virtual-time deployment: TTFT 100 ms while the offered rate is below `knee`, 5 s above it.

    The offered rate is read from the schedule itself (requests / span), like a real server sees it.
    `invalid_above` makes the client self-watch fail above that rate.
    """
    base_url = None

    def __init__(self, knee: float, invalid_above: float | None = None) -> None:
        self.knee = knee
        self.invalid_above = invalid_above
        self.flushes = 0
        self.steps: list[float] = []

    def run_step(self, schedule, *, step_id, timeout_s):
        offs = [s.send_offset_s for s in schedule]
        rate = (len(offs) - 1) / (offs[-1] - offs[0])
        self.steps.append(rate)
        ttft = 0.1 if rate <= self.knee else 5.0
        recs = [RequestRecord(request_id=s.request_id, step_id=step_id, scheduled_s=s.send_offset_s,
                              sent_s=s.send_offset_s, first_token_s=s.send_offset_s + ttft,
                              end_s=s.send_offset_s + ttft + 0.02 * 9, ttft_s=ttft, itl_s=[0.02] * 9,
                              e2e_s=ttft + 0.18, prompt_tokens=10, output_tokens=10, status="ok")
                for s in schedule]
        invalid = ["client send lag p99 50 ms > 10 ms"] if self.invalid_above and rate > self.invalid_above else []
        return StepOutcome(step_id=step_id, records=recs, duration_s=max(r.end_s for r in recs),
                           client_invalid_reasons=invalid)

    def flush_cache(self):
        self.flushes += 1
        return True
