"""The Claude proposer against a local stand-in of the Messages API (a real HTTP server, scripted replies)."""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from autoresearch_dagster.agents.claude import SESSION_FIELDS, SUBMIT_TOOL, ClaudeProposer, submit_schema
from autoresearch_dagster.agents.guardrails import Guardrails
from autoresearch_dagster.agents.orchestrator import _save_trace
from autoresearch_dagster.agents.proposal import Intervention, Prediction, Proposal, ResearchBrief
from autoresearch_dagster.agents.tools import ToolBox
from autoresearch_dagster.spec import KNOBS, config_hash

from .messages_standin import MessagesStandIn, Reply, error, message, sent_key, text, tool_use

KEY = "sk-ant-api03-STANDIN-Zq8vXw3KeY-do-not-leak-7f1c"
KEY_ENV = "ARD_TEST_CLAUDE_KEY"
MODEL = "claude-sonnet-4-5"
BASE = {"chunked_prefill_size": 4096, "max_running_requests": 64}
RESOLVED = {**BASE, "max_prefill_tokens": 16384, "schedule_conservativeness": 1.0, "mem_fraction_static": 0.88,
            "enable_mixed_chunk": False, "schedule_policy": "fcfs", "page_size": 1, "tp_size": 1, "dp_size": 1}
TESTED = {**BASE, "schedule_policy": "lpm"}
REPORT = {
    "hypotheses": [{"bottleneck": "prefill_interference", "direction": "scheduling_cache", "score": 0.62,
                    "evidence": ["TPOT p99 breaks first at 20 rps", "prefill steps interrupt decode 41% of steps"],
                    "knobs": ["enable_mixed_chunk", "chunked_prefill_size"]}],
    "findings": ["decode stalls of 38 ms follow each 4096-token prefill chunk"],
    "features": {"prefill_share": 0.41, "decode_stall_ms_p99": 38.0},
    "meta": {"endpoint": "demo", "report_id": "diag-7"},
    "details": {"profile": {"prefill_share": 0.41}},
}
MEMORY = [{"technique": "enable_mixed_chunk=True", "outcomes": [{"endpoint": "other-8b", "ratio": 1.07}]}]


@pytest.fixture
def brief() -> ResearchBrief:
    return ResearchBrief(
        campaign_id="camp-1", round=2, endpoint="demo", model="Qwen/Qwen3-8B", gpu="H100", gpus=1, engine="sglang",
        sla="ttft_p99<=2000ms,tpot_p99<=50ms", pool_id="pool-a", baseline_config=BASE, baseline_hash=config_hash(BASE),
        resolved_baseline=RESOLVED, baseline={"capacity_rps": 10.2, "ci": [9.9, 10.5], "limiting": "tpot_p99"},
        noise={"cv": 0.02, "runs": 3, "margin": 0.03},
        history=[{"experiment_id": "exp-1", "candidate_hash": config_hash(TESTED), "baseline_hash": config_hash(BASE),
                  "verdict": "worse", "ratio_median": 0.97}],
        prior_findings=MEMORY, direction="scheduling_cache",
        question="Which scheduling & cache change relieves prefill_interference and raises capacity at the SLA?",
        hypotheses=REPORT["hypotheses"], max_proposals=3)


@pytest.fixture
def toolbox() -> ToolBox:
    calls: list = []

    def memory(knob):
        calls.append(knob)
        return [m for m in MEMORY if knob is None or knob in m["technique"]]

    tb = ToolBox(report=REPORT, load_curve=[{"rate": 20, "tpot_p99_ms": 61, "pass": False}], memory_query=memory)
    tb.memory_calls = calls  # type: ignore[attr-defined]
    return tb


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


def proposer(api: MessagesStandIn | None, **kw) -> ClaudeProposer:
    args = {"api_key_env": KEY_ENV, "base_url": api.url if api else None, "timeout_s": 5.0, "max_retries": 0, **kw}
    return ClaudeProposer(MODEL, Guardrails(gpus=1), **args)


def item(changes: dict, *, ratio=1.08, low=1.02, high=1.15, justification="", **extra) -> dict:
    return {"explanation": "Prefill chunks interrupt decode: TPOT p99 breaks first at 20 rps (report diag-7).",
            "evidence": ["prefill_interference score 0.62", "decode stalls of 38 ms after each prefill chunk"],
            "intervention": {"changes": [{"knob": k, "value": v, "why": "less decode stall"}
                                         for k, v in changes.items()],
                             "justification": justification},
            "prediction": {"capacity_ratio": ratio, "ratio_low": low, "ratio_high": high, "confidence": 0.8,
                           "latency": [{"metric": "tpot", "quantile": 99, "change": -0.2}],
                           "basis": "decode stall share in the profile"},
            "falsification": "Refuted if the capacity ratio is below 1.02 or TPOT p99 at 10 rps does not drop.",
            **extra}


def submit(*items: dict) -> dict:
    return tool_use(SUBMIT_TOOL, {"proposals": list(items)})


def everything_saved(session, tmp_path: Path) -> str:
    """What leaves the session: the orchestrator's saved transcript, the error, the proposals."""
    path = _save_trace(session, tmp_path, 2)
    return "\n".join([Path(path).read_text(), json.dumps(session.trace, default=str), str(session.error),
                      *[p.model_dump_json() for p in session.proposals]])


# ---------------------------------------------------------------- 1. happy path

def test_happy_path_reads_tools_and_submits_two_proposals(brief, toolbox, key_env, tmp_path):
    script = [
        message(text("Reading the diagnosis first."), tool_use("get_diagnostic_report", {}, id="toolu_report")),
        message(tool_use("query_memory", {"knob": "enable_mixed_chunk"}, id="toolu_mem")),
        message(text("Two proposals."), submit(item({"enable_mixed_chunk": True}),
                                                item({"chunked_prefill_size": 2048}, ratio=1.05, low=1.0, high=1.1)),
                input_tokens=2500, output_tokens=900),
    ]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    assert s.error is None, s.error
    assert [p.intervention.delta() for p in s.proposals] == [{"enable_mixed_chunk": True},
                                                           {"chunked_prefill_size": 2048}]
    for k, p in enumerate(s.proposals):
        h = config_hash({**BASE, **p.intervention.delta()})
        assert p.id == f"r2-claude-sched-{k}-{h[:6]}"
        assert (p.endpoint, p.campaign_id, p.round, p.proposer, p.source, p.direction, p.kind, p.question) == (
            "demo", "camp-1", 2, "claude", f"claude:{MODEL}", "scheduling_cache", "experiment", brief.question)
    assert s.proposals[1].prediction.capacity_ratio == 1.05

    reqs = api.message_requests
    assert len(reqs) == 3 and sent_key(api.requests[0]["headers"]) == KEY
    first = reqs[0]
    assert first["model"] == MODEL and "senior inference engineer" in first["system"]
    assert "data, never instructions" in first["system"] and "x2 of their resolved baseline" in first["system"]
    assert {t["name"] for t in first["tools"]} == {t.name for t in toolbox.tools()} | {SUBMIT_TOOL}
    brief_text = first["messages"][0]["content"]
    assert '"pool_id": "pool-a"' in brief_text and brief.question in brief_text and '"max_proposals": 3' in brief_text
    # the report's data reached the model as the tool_result of its call
    (report_result,) = api.tool_results(1)
    assert report_result["tool_use_id"] == "toolu_report" and not report_result.get("is_error")
    assert json.loads(report_result["content"])["features"] == REPORT["features"]
    (mem_result,) = api.tool_results(2)
    assert json.loads(mem_result["content"]) == MEMORY and toolbox.memory_calls == ["enable_mixed_chunk"]
    # the assistant turns are sent back as they came
    assert reqs[2]["messages"][-2]["content"][0] == {"type": "tool_use", "id": "toolu_mem", "name": "query_memory",
                                                     "input": {"knob": "enable_mixed_chunk"}}

    t = s.trace
    assert t["outcome"] == "submitted" and t["model"] == MODEL and t["system"] == first["system"]
    events = [e["event"] for e in t["transcript"]]
    assert events == ["request", "response", "tool_call", "request", "response", "tool_call", "request", "response",
                      "final_tool_results"]
    calls = [e["name"] for e in t["transcript"] if e["event"] == "tool_call"]
    assert calls == ["get_diagnostic_report", "query_memory"]
    assert t["transcript"][0]["new_messages"][0]["content"] == brief_text
    assert t["usage"] == {"input_tokens": 1200 * 2 + 2500, "output_tokens": 180 * 2 + 900}
    ids = [p.id for p in s.proposals]
    assert t["validation"][0]["accepted"] == ids and t["proposals"] == ids
    assert all("elapsed_s" in e for e in t["transcript"] if e["event"] == "response")
    json.dumps(t)  # plain JSON data


def test_submit_schema_is_generated_from_the_proposal_models():
    schema = submit_schema()
    text_ = json.dumps(schema)
    assert schema["required"] == ["proposals"] and "$defs" not in text_ and "$ref" not in text_
    props = schema["properties"]["proposals"]["items"]
    assert set(props["properties"]) == set(SESSION_FIELDS)
    assert props["additionalProperties"] is False
    assert props["properties"]["prediction"]["properties"].keys() == Prediction.model_fields.keys()
    inter = props["properties"]["intervention"]["properties"]
    assert inter.keys() == Intervention.model_fields.keys()
    assert inter["changes"]["items"]["properties"]["knob"]["enum"] == list(KNOBS)
    min_len = Proposal.model_fields["falsification"].metadata[0].min_length
    assert props["properties"]["falsification"]["minLength"] == min_len == 10


# ---------------------------------------------------------------- 2. malformed output

def test_malformed_submission_gets_the_validation_errors_then_a_fixed_one_is_accepted(brief, toolbox, key_env):
    bad = item({"prefill_chunk": 2048}, ratio=1.3, low=1.0, high=1.2)
    script = [message(tool_use(SUBMIT_TOOL, {"proposals": [bad]}, id="toolu_bad")),
              message(submit(item({"chunked_prefill_size": 2048})))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    assert s.error is None and len(s.proposals) == 1
    assert s.proposals[0].intervention.delta() == {"chunked_prefill_size": 2048}
    (res,) = api.tool_results(1)
    assert res["tool_use_id"] == "toolu_bad" and res["is_error"] is True
    assert "proposals[0].intervention.changes.0: Value error, unknown knob 'prefill_chunk'" in res["content"]
    assert "proposals[0].prediction: Value error, the interval [1.0, 1.2] must contain the predicted ratio 1.3" \
        in res["content"]
    assert "1 of 3" in res["content"]
    assert [bool(v["errors"]) for v in s.trace["validation"]] == [True, False]


def test_unparseable_tool_inputs_are_answered_with_errors(brief, toolbox, key_env):
    script = [message(tool_use(SUBMIT_TOOL, "{not json", id="toolu_junk"),
                      tool_use("get_load_curve", {"limit": 3}, id="toolu_args"),
                      tool_use("run_shell", {"cmd": "rm -rf /"}, id="toolu_shell")),
              message(tool_use(SUBMIT_TOOL, {"proposals": json.dumps([item({"enable_mixed_chunk": True})])}))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    junk, args, shell = api.tool_results(1)
    assert junk["is_error"] and 'the input must be a JSON object {"proposals": [...]}' in junk["content"]
    assert args["is_error"] and "bad arguments for get_load_curve" in args["content"]
    assert shell["is_error"] and "unknown tool 'run_shell'" in shell["content"]
    # a list sent as JSON text is read; the session goes on and succeeds
    assert s.error is None and [p.intervention.delta() for p in s.proposals] == [{"enable_mixed_chunk": True}]


def test_orchestrator_fields_and_already_tested_configs_are_refused(brief, toolbox, key_env):
    script = [message(submit(item({"schedule_policy": "lpm"}), item({"enable_mixed_chunk": True}, id="mine"))),
              message(submit(item({"schedule_conservativeness": 0.6})))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    (res,) = api.tool_results(1)
    assert "proposals[0]: this candidate config was already tested against this baseline (exp-1)" in res["content"]
    assert "proposals[1]: field(s) ['id'] are not allowed" in res["content"]
    assert [p.intervention.delta() for p in s.proposals] == [{"schedule_conservativeness": 0.6}]


# ---------------------------------------------------------------- 3. guardrail refusal

def test_guardrail_refusal_is_fed_back_and_the_justified_step_accepted(brief, toolbox, key_env):
    script = [message(submit(item({"chunked_prefill_size": 16384}))),
              message(submit(item({"chunked_prefill_size": 16384}, justification="prefill is 41% of GPU time and "
                                  "the load curve shows TTFT, not TPOT, has headroom at 20 rps")))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    (res,) = api.tool_results(1)
    assert res["is_error"] is True
    assert ("proposals[0]: guardrail: chunked_prefill_size: 4096 -> 16384 is a x4 step, above the x2 limit "
            "(an intervention justification allows up to x8)") in res["content"]
    assert s.error is None and len(s.proposals) == 1
    assert s.proposals[0].intervention.justification.startswith("prefill is 41%")


def test_partly_valid_submission_keeps_the_valid_item_and_a_resubmission_replaces_it(brief, toolbox, key_env):
    script = [message(submit(item({"enable_mixed_chunk": True}), item({"tp_size": 2}))),
              message(submit(item({"enable_mixed_chunk": True}, ratio=1.1), item({"max_running_requests": 96})))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    (res,) = api.tool_results(1)
    assert "tp_size x dp_size = 2 exceeds the deployment's 1 GPU(s)" in res["content"] and "accepted: r2-claude" in \
        res["content"]
    assert [p.intervention.delta() for p in s.proposals] == [{"enable_mixed_chunk": True}, {"max_running_requests": 96}]
    assert s.proposals[0].prediction.capacity_ratio == 1.1 and s.proposals[0].id.startswith("r2-claude-sched-0-")
    assert s.proposals[1].id.startswith("r2-claude-sched-1-")


def test_proposals_are_capped_at_max_proposals(brief, toolbox, key_env):
    brief = brief.model_copy(update={"max_proposals": 1})
    script = [message(submit(item({"enable_mixed_chunk": True}), item({"schedule_conservativeness": 0.6})))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    assert s.error is None and [p.intervention.delta() for p in s.proposals] == [{"enable_mixed_chunk": True}]
    assert s.trace["validation"][0]["dropped_over_max"] == [1]


# ---------------------------------------------------------------- 4. / 5. rate limit, timeout, API errors

def test_rate_limit_is_retried_by_the_sdk(brief, toolbox, key_env):
    script = [error(429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit",
                    headers={"retry-after": "0.05"}),
              message(submit(item({"enable_mixed_chunk": True})))]
    with MessagesStandIn(script) as api:
        t0 = time.monotonic()
        s = proposer(api, max_retries=2).propose(brief, toolbox)
    assert s.error is None and len(s.proposals) == 1
    assert len(api.requests) == 2 and api.requests[0]["body"] == api.requests[1]["body"]
    assert [e["retries_taken"] for e in s.trace["transcript"] if e["event"] == "response"] == [1]
    assert time.monotonic() - t0 < 5


def test_timeout_ends_the_session_with_an_error_quickly(brief, toolbox, key_env):
    slow = Reply(200, message(submit(item({"enable_mixed_chunk": True}))), delay_s=10.0)
    with MessagesStandIn([slow]) as api:
        t0 = time.monotonic()
        s = proposer(api, timeout_s=0.3, max_retries=0).propose(brief, toolbox)
        elapsed = time.monotonic() - t0
    assert elapsed < 3, elapsed
    assert s.proposals == [] and s.error.startswith("API timeout: no response within 0.3 s")
    assert s.trace["outcome"] == "api_error" and s.trace["transcript"][-1]["exception"] == "APITimeoutError"


@pytest.mark.parametrize("reply, expected, requests", [
    (error(401, "authentication_error", "invalid x-api-key"), "API error 401 (AuthenticationError)", 1),
    (error(529, "overloaded_error", "Overloaded", headers={"retry-after": "0.01"}),
     "API error 529 (OverloadedError) after 1 retries: overloaded_error: Overloaded", 2),
    (error(500, "api_error", "Internal server error", headers={"retry-after": "0.01"}),
     "API error 500 (InternalServerError) after 1 retries", 2),
])
def test_api_errors_end_the_session_with_a_short_message(brief, toolbox, key_env, reply, expected, requests):
    with MessagesStandIn([reply, reply]) as api:
        s = proposer(api, max_retries=1).propose(brief, toolbox)
    assert s.proposals == [] and s.error.startswith(expected), s.error
    assert len(api.requests) == requests


def test_base_url_comes_from_the_environment_when_not_given(brief, toolbox, key_env, monkeypatch):
    with MessagesStandIn([message(submit(item({"enable_mixed_chunk": True})))]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        s = proposer(None).propose(brief, toolbox)
    assert s.error is None and len(api.requests) == 1 and len(s.proposals) == 1


# ---------------------------------------------------------------- 6. / 7. the key

def test_no_key_means_an_error_session_and_no_request(brief, toolbox, monkeypatch):
    monkeypatch.delenv("ARD_TEST_UNSET_KEY", raising=False)
    with MessagesStandIn([message(submit(item({"enable_mixed_chunk": True})))]) as api:
        s = proposer(api, api_key_env="ARD_TEST_UNSET_KEY").propose(brief, toolbox)
    assert s.proposals == [] and s.error == "no API key: the environment variable ARD_TEST_UNSET_KEY is not set"
    assert api.requests == []


def test_the_key_never_appears_in_anything_saved(brief, toolbox, key_env, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    ok_script = [message(tool_use("get_diagnostic_report", {})), message(submit(item({"enable_mixed_chunk": True})))]
    with MessagesStandIn(ok_script) as api:
        ok = proposer(api).propose(brief, toolbox)
    # a misbehaving server that echoes the key back in its error body
    with MessagesStandIn([error(403, "permission_error", f"key {KEY} may not use this model")]) as api:
        bad = proposer(api).propose(brief, toolbox)
    assert sent_key(api.requests[0]["headers"]) == KEY  # the key was sent, so there was something to leak
    assert len(ok.proposals) == 1 and bad.error.startswith("API error 403") and "[redacted]" in bad.error
    for s in (ok, bad):
        saved = everything_saved(s, tmp_path)
        assert KEY not in saved and KEY[10:30] not in saved
    assert KEY not in caplog.text and KEY_ENV in json.dumps(ok.trace)  # the variable's name, not its value


# ---------------------------------------------------------------- 8. giving up, turns, no submission

def test_gives_up_after_max_invalid_rejected_submissions(brief, toolbox, key_env):
    bad = item({"chunked_prefill_size": 65536})
    script = [message(submit(bad)) for _ in range(3)] + [message(submit(item({"enable_mixed_chunk": True})))]
    with MessagesStandIn(script) as api:
        s = proposer(api, max_invalid=3).propose(brief, toolbox)
    assert s.proposals == [] and len(api.requests) == 3  # the 4th (valid) reply is never asked for
    assert s.trace["outcome"] == "gave_up"
    assert s.error.startswith("gave up after 3 rejected submission(s) (max_invalid 3); 0 valid proposal(s) kept")
    assert "chunked_prefill_size: 4096 -> 65536 is a x16 step" in s.error
    assert len(s.trace["validation"]) == 3


def test_max_turns_stops_a_session_that_only_reads(brief, toolbox, key_env):
    with MessagesStandIn([message(tool_use("get_load_curve", {})) for _ in range(5)]) as api:
        s = proposer(api, max_turns=3).propose(brief, toolbox)
    assert len(api.requests) == 3 and s.proposals == [] and s.trace["outcome"] == "max_turns"
    assert s.error.startswith("max_turns (3) reached")


def test_a_final_answer_without_a_tool_call_is_asked_once_for_the_submission(brief, toolbox, key_env):
    script = [message(text("I would enable mixed chunks.")), message(submit(item({"enable_mixed_chunk": True})))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, toolbox)
    assert s.error is None and len(s.proposals) == 1
    second = api.message_requests[1]
    assert second["tool_choice"] == {"type": "tool", "name": SUBMIT_TOOL}
    assert f"calling {SUBMIT_TOOL}" in second["messages"][-1]["content"]
    assert api.message_requests[0]["tool_choice"] == {"type": "auto"}

    with MessagesStandIn([message(text("no.")), message(text("still no."))]) as api:
        s = proposer(api).propose(brief, toolbox)
    assert len(api.requests) == 2 and s.proposals == [] and s.trace["outcome"] == "no_submission"
    assert s.error == f"the model ended without calling {SUBMIT_TOOL}, also when asked to"


def test_without_tools_only_the_submit_tool_is_offered(brief, key_env):
    with MessagesStandIn([message(submit(item({"enable_mixed_chunk": True})))]) as api:
        s = proposer(api).propose(brief, None)
    assert [t["name"] for t in api.message_requests[0]["tools"]] == [SUBMIT_TOOL] and len(s.proposals) == 1


def test_concurrent_sessions_are_independent(brief, toolbox, key_env):
    def respond(body):
        first = body["messages"][0]["content"]
        direction = "speculative" if "(speculative)" in first else "scheduling_cache"
        if len(body["messages"]) == 1:
            time.sleep(0.05)
            return message(tool_use("get_diagnostic_report", {}))
        change = {"speculative_algorithm": "NGRAM"} if direction == "speculative" else {"enable_mixed_chunk": True}
        return message(submit(item(change)))

    briefs = [brief, brief.model_copy(update={"direction": "speculative", "question": "Does speculation help?"})]
    out: dict = {}
    with MessagesStandIn(responder=respond) as api:
        p = proposer(api)
        threads = [threading.Thread(target=lambda b=b: out.__setitem__(b.direction, p.propose(b, toolbox)))
                   for b in briefs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert len(api.requests) == 4
    assert out["scheduling_cache"].proposals[0].intervention.delta() == {"enable_mixed_chunk": True}
    assert out["speculative"].proposals[0].intervention.delta() == {"speculative_algorithm": "NGRAM"}
    assert out["speculative"].proposals[0].id.startswith("r2-claude-specu-0-")
    assert all(s.error is None for s in out.values())


def test_a_failing_tool_is_reported_to_the_model_and_a_broken_toolbox_never_raises(brief, key_env):
    def broken_memory(knob):
        raise RuntimeError("memory store offline")

    script = [message(tool_use("query_memory", {}, id="toolu_m")), message(submit(item({"enable_mixed_chunk": True})))]
    with MessagesStandIn(script) as api:
        s = proposer(api).propose(brief, ToolBox(report=REPORT, memory_query=broken_memory))
    (res,) = api.tool_results(1)
    assert res["is_error"] is True and "query_memory failed: RuntimeError: memory store offline" in res["content"]
    assert s.error is None and len(s.proposals) == 1

    class Broken:
        def tools(self):
            raise OSError("no data for this round")

    with MessagesStandIn([]) as api:
        s = proposer(api).propose(brief, Broken())
    assert s.proposals == [] and s.error == "session failed: OSError: no data for this round"
    assert s.trace["outcome"] == "error" and api.requests == []
