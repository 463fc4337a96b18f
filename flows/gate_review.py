"""A person at the gate: the flow run pauses in Prefect with the gate's evidence and a form.

A gate with `review: undecided` (the budget ran out and the rule never held) or `review: always` (every
stop or fail the gate proposes) does not act on its own: the stage's flow run pauses (Prefect's
`pause_flow_run` with a `GateReview` form), its page in the Prefect UI shows the gate's table — each
condition's value (or interval bound) against its bar, the guards, the tokens, a link to the stage's
MLflow run — and a Resume button opens the form:

- approve: the stage ends here and the pipeline goes on with the checkpoint the gate names (its last one
  when the gate proposed to fail);
- stop: the stage fails here, and with it the pipeline (GateFailed, "stopped by <reviewer>");
- extend: train `extend_tokens` more (past the stage's budget, the LR schedule held at its end value),
  evaluate, and ask the gate (and, when it still asks, the person) again.

Nobody answering within `review_timeout_s` leaves the gate's own decision standing, recorded as decided
by "timeout"; the run is put back to Running (Prefect would otherwise fail a pause that timed out).
Prefect's open-source server knows no users, so "by whom" is the form's `reviewer` field
("unnamed" when left empty). Everything a form carries is text from outside: control characters are
dropped and lengths capped before it is recorded (MLflow tags on the stage's run, the closing table).
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from typing import Literal

from prefect import get_client, get_run_logger
from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.settings import get_current_settings
from prefect.states import Running
from pydantic import Field

REVIEW_TAG = "stagewise.review"
"""Prefix of the tags a review leaves on the stage's MLflow run: `.decision`, `.by`, `.at`, `.comment`,
`.proposed` (what the gate itself had decided), `.extended_tokens`."""
TIMEOUT = "timeout"
"""`decision` and `by` of a review nobody answered in time: the gate's own decision stood."""


class GateReview(RunInput):
    """The form a person fills in on the paused flow run's page (Resume)."""

    decision: Literal["approve", "stop", "extend"] = Field(
        "approve", description="approve: end the stage and go on; stop: stop the pipeline here; "
                               "extend: train extend_tokens more, then ask the gate again")
    extend_tokens: int = Field(0, description="With extend: tokens to train before the gate asks again")
    reviewer: str = Field("", description="Your name, recorded with the decision")
    comment: str = Field("", description="Why, recorded with the decision")


def clean(text: str, limit: int) -> str:
    """Form text as it may be recorded: control characters dropped, whitespace runs one space, capped."""
    text = re.sub(r"[\x00-\x1f\x7f-\x9f]", " ", str(text))
    return re.sub(r"\s+", " ", text).strip()[:limit]


def _md(text: object) -> str:
    """A value inside a Markdown table cell or code span (recipe metric names are text from outside)."""
    return clean(str(text), 200).replace("|", "\\|").replace("`", "'")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def evidence_markdown(stage: str, decision: dict, run_url: str, budget: int, timeout_s: float, extend_tokens: int) -> str:
    """What the paused run's page shows above the form: the proposal, the gate's table, the choices."""
    ev = decision.get("evidence") or {}
    lines = [f"### The gate of `{_md(stage)}` asks a person",
             f"The gate proposes **{decision['action']}**: {_md(decision.get('reason', ''))}", "",
             "| condition | value | bar | holds |", "|---|---:|---:|---|"]
    for c in ev.get("conditions", []):
        lines.append(f"| `{_md(c['metric'])}` ({c['group']}) | {_num(c['current'])} | {c['op']} {_num(c['threshold'])} "
                     f"| {'yes' if c['holds'] else 'no'} |")
    for g in ev.get("guards", []):
        lines.append(f"| guard `{_md(g['metric'])}`: drop from {g['baseline']} | {_num(g['drop'])} | <= {_num(g['max_drop'])} "
                     f"| {'no' if g['violated'] else 'yes'} |")
    lines += ["", f"Trained {decision.get('tokens_seen', 0):,} tokens of a {budget:,}-token budget. "
                  f"[The stage's MLflow run]({run_url})", "",
              "**approve**: end the stage here and go on with the checkpoint the gate names. "
              "**stop**: stop the pipeline here. "
              f"**extend**: train `extend_tokens` more (default {extend_tokens:,}), then ask the gate again.", "",
              f"With no answer in {timeout_s:.0f} s the gate's own decision stands."]
    return "\n".join(lines)


def ask_person(stage: str, decision: dict, *, run_url: str, budget: int, timeout_s: float, extend_tokens: int,
               poll_s: float = 5.0) -> dict:
    """Pause this flow run until a person answers the gate's form (or `timeout_s` passes); the review:
    {decision: approve|stop|extend|timeout, by, at (UTC, ISO 8601), comment, proposed, extend_tokens}."""
    context = FlowRunContext.get()
    if context is None:
        raise RuntimeError(f"{stage}: a gate with review needs a Prefect flow run to pause")
    logger = get_run_logger()
    form = GateReview.with_initial_data(
        description=evidence_markdown(stage, decision, run_url, budget, timeout_s, extend_tokens),
        extend_tokens=extend_tokens)
    ui = get_current_settings().ui_url
    page = f"{ui.rstrip('/')}/runs/flow-run/{context.flow_run.id}" if ui else "this flow run's page in the Prefect UI"
    logger.warning("%s: the gate proposes %s and waits up to %.0f s for a person: Resume %s to approve, stop "
                   "or extend", stage, decision["action"], timeout_s, page)
    key = pause_key(stage, int(decision.get("tokens_seen") or 0))
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=int(timeout_s), poll_interval=poll_s, key=key)
    except FlowPauseTimeout:
        _back_to_running(context.flow_run.id, stage)
        review = {"decision": TIMEOUT, "by": TIMEOUT, "comment": "", "extend_tokens": 0}
    else:
        tokens = answer.extend_tokens if answer.extend_tokens > 0 else extend_tokens
        review = {"decision": answer.decision, "by": clean(answer.reviewer, 80) or "unnamed",
                  "comment": clean(answer.comment, 500), "extend_tokens": tokens if answer.decision == "extend" else 0}
    review |= {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "proposed": decision["action"]}
    logger.info("%s: gate review: %s by %s", stage, review["decision"], review["by"])
    return review


def pause_key(stage: str, tokens: int) -> str:
    """The pause's key, unique within a flow run: Prefect answers a pause whose key already fired in the
    run with that pause's input (SFT's sub-stages share one flow run and may end at the same token
    count), and keys allow letters, digits and dashes only: a slug of the stage, a hash of its name."""
    slug = re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-")[:40]
    return f"gate-{slug}-{hashlib.sha256(stage.encode()).hexdigest()[:8]}-{tokens}"


def _back_to_running(flow_run_id, stage: str) -> None:
    """Leave the pause that timed out: Prefect fails a run whose pause expired, and refuses it Running
    again through its ordinary rules, so the state is set with force."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Running(message=f"{stage}: nobody reviewed the gate in time; "
                                                               "its own decision stands"), force=True)


def applied(decision: dict, review: dict) -> dict:
    """The gate's decision after a review that ends the asking (approve, stop, timeout), the review on it."""
    out = {**decision, "review": review}
    if review["decision"] == "approve" and decision["action"] == "fail":
        out |= {"action": "stop", "step": None, "reason": f"approved by {review['by']} over: {decision['reason']}"}
    elif review["decision"] == "approve":
        out |= {"reason": f"approved by {review['by']}: {decision['reason']}"}
    elif review["decision"] == "stop":
        why = f" ({review['comment']})" if review["comment"] else ""
        out |= {"action": "fail", "reason": f"stopped by {review['by']} at the gate{why}"}
    return out


def review_tags(review: dict) -> dict[str, str]:
    """The review as tags on the stage's MLflow run."""
    return {f"{REVIEW_TAG}.{k}": str(v) for k, v in review.items() if k != "extend_tokens"} | {
        f"{REVIEW_TAG}.extended_tokens": str(review.get("extended_tokens", 0))}


def review_text(review: dict | None) -> str:
    """One line for the closing table: e.g. `reviewed: approve by alice at 2026-12-06T23:41:00+00:00`."""
    if not review:
        return ""
    text = f"reviewed: {review['decision']} by {review['by']} at {review['at']}"
    if review.get("extended_tokens"):
        text += f", extended {review['extended_tokens']:,} tokens"
    return text
