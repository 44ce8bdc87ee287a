"""Owns the human side of a campaign: the review package of its best confirmed config and the recorded
approval decision.

Working baselines are promoted automatically inside a campaign; production is not. The review
package (``<campaign dir>/review/``) holds what a person needs to decide: the config diff against
the original, the SGLang launch command, the gain at the SLA with its interval (and, for an autoscaled
endpoint, the GPUs saved under the real demand curve), lossless or lossy
with the correctness results, the evidence trail (every era and the experiments behind it, with
their verdicts and traces) and the open questions. An approval is a recorded human action (who,
decision, note): appended to the package's ``approvals.jsonl`` and the lake's ``approvals`` table.

Approval gates the deploy artifact: approving writes ``review/deploy/`` (``deploy.json``: the launch command,
the config diff, the package's hash and who approved it when; ``launch.sh``), and only for the package of the
campaign's latest best config: a stale one (the campaign beside it moved on to another best config or was
replaced by a new campaign, or the lake holds a later finished campaign of the endpoint) is refused. A rejection or a request for changes is recorded and deploys nothing.
Nothing is run against production by the product.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import uuid
from pathlib import Path
from typing import Any

from autoresearch_dagster.experiments.gpu_savings import LABEL, format_line
from autoresearch_dagster.outputs.files import atomic_write_text, json_safe, write_json
from autoresearch_dagster.results import utc_now
from autoresearch_dagster.spec import SpecError, launch_flags, table_of

DECISIONS = ("approve", "reject", "request_changes")


def launch_command(endpoint: Any, config: dict[str, Any]) -> str:
    """The command that serves ``config`` on the endpoint's engine (vLLM's OpenAI server, else SGLang's)."""
    model = (endpoint.engine_options or {}).get("model_path") or endpoint.model
    if endpoint.engine == "vllm":
        from autoresearch_dagster.emulator.engine_view import model_config_path

        try:  # the model directory as the spec resolves it (relative paths are the spec file's)
            model = model_config_path(endpoint).parent
        except SpecError:
            pass
        extra = [str(a) for a in (endpoint.engine_options or {}).get("extra_args") or []]
        return " ".join(["vllm", "serve", shlex.quote(str(model)),
                         *[shlex.quote(f) for f in launch_flags(config, "vllm") + extra]])
    return " ".join(["python", "-m", "sglang.launch_server", "--model-path", shlex.quote(str(model)),
                     *[shlex.quote(f) for f in launch_flags(config)]])


def config_diff(original: dict[str, Any], proposed: dict[str, Any]) -> dict[str, list[Any]]:
    table = list(table_of(original, proposed))
    keys = sorted(set(original) | set(proposed), key=lambda k: table.index(k) if k in table else 999)
    return {k: [original.get(k), proposed.get(k)] for k in keys if original.get(k) != proposed.get(k)}


def write_review_package(report: dict[str, Any], state: Any, endpoint: Any, out: Path) -> Path:
    out = Path(out)
    best = report["best_config"]
    diff = config_diff(report["original_config"], best)
    review_id = f"rv-{report['campaign_id']}-{report['best_config_hash']}"
    trail = []
    for era in report["eras"]:
        trail.append({"era": era["index"], "reason": era["reason"], "config_hash": era["config_hash"],
                      "capacity_rps": era["capacity_rps"], "source_experiment_id": era["source_experiment_id"],
                      "delta": era["delta"], "replication": era["replication"]})
    evidence = {"eras": trail, "experiments": [{k: e.get(k) for k in ("id", "proposal_id", "source", "kind", "direction",
                                                                     "intervention", "prediction", "verdict", "ratio_median",
                                                                     "ci", "confirmed", "correctness_passed", "trace",
                                                                     "reason")} for e in report["experiments"]]}
    ci = report.get("gain_ci") or [None, None]
    cmd = launch_command(endpoint, best)
    package = {"review_id": review_id, "campaign_id": report["campaign_id"], "endpoint": report["endpoint"],
               "sla": report["sla"], "config_hash": report["best_config_hash"], "original_config": report["original_config"],
               "proposed_config": best, "config_diff": diff, "launch_command": cmd,
               "gain": {"ratio": report["gain"], "ci": ci, "confidence": report["gain_confidence"],
                        "original_rps_per_gpu": report["original_rps_per_gpu"],
                        "final_rps_per_gpu": report["final_rps_per_gpu"]},
               "gpu_savings": report.get("gpu_savings"),
               "lossy": report["lossy"], "correctness": report["correctness"], "evidence": evidence,
               "open_questions": report["open_questions"], "ended_because": report["ended_because"],
               "created_at": utc_now().isoformat()}
    write_json(out / "review.json", json_safe(package), sort_keys=False)
    write_json(out / "config_diff.json", json_safe({"original": report["original_config"], "proposed": best,
                                                    "changes": diff}))
    write_json(out / "evidence.json", json_safe(evidence))
    atomic_write_text(out / "launch_command.sh", "#!/bin/sh\n# the reviewed config; nothing runs it for you\n" + cmd + "\n")
    gain_line = (f"{report['gain']:.3f}x (90% CI {ci[0]:.3f}-{ci[1]:.3f}): {report['original_rps_per_gpu']:.2f} -> "
                 f"{report['final_rps_per_gpu']:.2f} req/s/GPU at the SLA" if report["gain"] is not None
                 else "not measured")
    saved = report.get("gpu_savings")
    saved_line = f"\n**{LABEL}**: {format_line(saved)}." if saved else ""
    changes = "\n".join(f"| `{k}` | {json.dumps(a)} | {json.dumps(b)} |" for k, (a, b) in diff.items()) \
        or "| (none) | | |"
    corr = "\n".join(f"- {c['experiment_id']} {json.dumps(c.get('intervention'), default=str)}: "
                     f"{'passed' if c.get('passed') else 'FAILED'}" for c in report["correctness"]) \
        or "- no lossy change on the path to this config: no gate needed"
    eras = "\n".join(f"- era {t['era']} ({t['reason']}): `{t['config_hash']}` "
                     f"{(t['capacity_rps'] or 0):.2f} req/s" + (f", from {t['source_experiment_id']} "
                                                               f"{json.dumps(t['delta'], default=str)}"
                                                               if t["source_experiment_id"] else "")
                     + (f"; re-measured {t['replication']['ratio']:.3f}x "
                        f"({'replicated' if t['replication']['replicated'] else 'not replicated'})"
                        if t.get("replication") else "") for t in trail)
    questions = "\n".join(f"- {q}" for q in report["open_questions"]) or "- none"
    readme = f"""# Review: {report['endpoint']} — campaign {report['campaign_id']}

Review id `{review_id}`. Nothing is deployed by AutoResearch: this package asks for a decision.

**Gain at the SLA ({report['sla']})**: {gain_line}.{saved_line}
**{'LOSSY' if report['lossy'] else 'Lossless'}** change. Campaign ended because: {report['ended_because']}.

## Config diff (original -> proposed)

| knob | original | proposed |
|---|---|---|
{changes}

## Launch command

```sh
{cmd}
```

## Correctness

{corr}

## Evidence trail

{eras}

Every experiment, its prediction, verdict and the proposer's trace: `evidence.json`.

## Open questions

{questions}

## Decide

`dagster job launch -j approve_production` (config: who, decision approve | reject | request_changes, note) or
`autoresearch campaign approve --review {out} --who NAME --decision approve --note "..."`.
"""
    atomic_write_text(out / "README.md", readme)
    return out


def package_hash(review_dir: str | Path) -> str:
    """The hash of the review package as a person read it: its ``review.json`` bytes."""
    return hashlib.sha256((Path(review_dir) / "review.json").read_bytes()).hexdigest()[:16]


def stale_because(package: dict[str, Any], review_dir: Path, results: Any = None) -> str | None:
    """Why a package is not the one to deploy (None: it is): the campaign beside it (its ``state.json``) or the
    lake's latest finished campaign of the endpoint names another best config."""
    from autoresearch_dagster.campaign.report import best_era
    from autoresearch_dagster.campaign.state import CampaignState

    state_path = review_dir.parent / "state.json"
    if state_path.is_file():
        st = CampaignState.load(state_path)
        latest = best_era(st).config_hash
        if st.campaign_id != package["campaign_id"]:
            return (f"the package is of campaign {package['campaign_id']}, but {review_dir.parent} now holds campaign "
                    f"{st.campaign_id} (best config {latest})")
        if latest != package["config_hash"]:
            return f"the campaign's best config is now {latest}, the package proposes {package['config_hash']}"
    if results is not None:
        rows = results.query("SELECT campaign_id, best_config_json FROM campaign_results WHERE endpoint = ? "
                             "ORDER BY finished_at DESC LIMIT 1", [package["endpoint"]])
        if rows and rows[0][0] != package["campaign_id"]:
            return (f"the endpoint's latest finished campaign is {rows[0][0]}, the package is of "
                    f"{package['campaign_id']}")
    return None


def write_deploy_artifact(review_dir: Path, package: dict[str, Any], row: dict[str, Any]) -> Path:
    """``review/deploy/``: what the approver approved, ready to apply (``deploy.json``, ``launch.sh``)."""
    out = review_dir / "deploy"
    artifact = {"approval_id": row["approval_id"], "review_id": package["review_id"],
                "package_hash": row["package_hash"], "campaign_id": package["campaign_id"],
                "endpoint": package["endpoint"], "config_hash": package["config_hash"],
                "approved_by": row["who"], "approved_at": row["recorded_at"], "note": row["note"],
                "launch_command": package["launch_command"], "config_diff": package["config_diff"],
                "proposed_config": package["proposed_config"]}
    write_json(out / "deploy.json", json_safe(artifact), sort_keys=False)
    atomic_write_text(out / "launch.sh", f"#!/bin/sh\n# {package['endpoint']}: config {package['config_hash']} of "
                                         f"campaign {package['campaign_id']}\n# review package {row['package_hash']}, "
                                         f"approved by {row['who']} at {row['recorded_at']}\n"
                                         f"{package['launch_command']}\n")
    return out


def record_approval(review_dir: str | Path, *, who: str, decision: str, note: str = "", results: Any = None,
                    run_id: str | None = None) -> dict[str, Any]:
    """A person's decision on a review package: appended to ``approvals.jsonl`` and the lake; an approval of the
    latest best config also writes the deploy artifact (``deploy_path``), a stale package is refused."""
    review_dir = Path(review_dir)
    path = review_dir / "review.json"
    if not path.is_file():
        raise SpecError(f"{review_dir} is not a review package (no review.json)")
    if decision not in DECISIONS:
        raise SpecError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    if not who.strip():
        raise SpecError("an approval names who decided (--who)")
    package = json.loads(path.read_text())
    if decision == "approve":
        stale = stale_because(package, review_dir, results)
        if stale:
            raise SpecError(f"stale review package {review_dir}: {stale}; approve the current package instead")
    row = {"approval_id": f"ap-{uuid.uuid4().hex[:12]}", "review_id": package["review_id"],
           "campaign_id": package["campaign_id"], "config_hash": package["config_hash"], "decision": decision,
           "who": who.strip(), "note": note, "review_path": str(review_dir), "run_id": run_id,
           "package_hash": package_hash(review_dir), "deploy_path": None, "recorded_at": utc_now().isoformat()}
    if decision == "approve":
        row["deploy_path"] = str(write_deploy_artifact(review_dir, package, row))
    log = review_dir / "approvals.jsonl"
    old = log.read_text() if log.exists() else ""
    atomic_write_text(log, old + json.dumps(row, sort_keys=True) + "\n")
    if results is not None:
        results.append_rows({"approvals": [{**{k: v for k, v in row.items() if k != "review_id"},
                                            "recorded_at": utc_now()}]}, endpoint=package["endpoint"])
    return row


def approvals(review_dir: str | Path) -> list[dict[str, Any]]:
    log = Path(review_dir) / "approvals.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
