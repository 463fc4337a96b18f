"""Training a stage in stretches, evaluating at each mark, and asking its gate.

Used by every training stage flow (pretrain, sft, ...). The marks are the ends of the
stage's phases, plus every `gate.eval_every_tokens` when the stage has a gate. At each mark
the checkpoint is evaluated (`evaluate`), and the gate decides from what MLflow holds:
continue, stop (hand on the checkpoint it names) or fail (raise GateFailed with the
evidence; the pipeline stops). A gated stage whose gate reads the start (relative thresholds,
guards, patience) is evaluated once before it trains. A stage resumed mid-way carries the
metric history of its interrupted run over into the new one (Tracker.carry_over), so that
start value, and the loss curves, survive the crash. A gate with `review` hands its stop or fail
to a person first (flows/gate_review.py: the flow run pauses in Prefect), who may approve it, stop
the pipeline, or extend the budget (`reviewed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from prefect import get_run_logger

from stagewise.flows.gate_review import applied, ask_person, review_tags
from stagewise.model.checkpoint import list_checkpoints, read_meta
from stagewise.model.train_spec import TrainSpec
from stagewise.refs import CheckpointRef
from stagewise.store.tracking import Tracker
from stagewise.tasks.evaluate import gate_task
from stagewise.tasks.train import train_task


class GateFailed(RuntimeError):
    """A gate answered `fail`: the message carries its reason and evidence."""

    def __init__(self, stage: str, decision: dict):
        self.decision = decision
        super().__init__(f"stage {stage}: gate failed: {decision['reason']}")


def marks(phase_ends: list[tuple[str, int]], every: int | None, total: int) -> list[tuple[str, int]]:
    """(label, until_tokens) of each stretch: phase ends and gate evaluation points, sorted."""
    points = {min(end, total): label for label, end in phase_ends}
    if every:
        for t in range(every, total, every):
            points.setdefault(t, next(label for label, end in phase_ends if t <= end))
    return sorted(((label, t) for t, label in points.items()), key=lambda x: x[1])


def checkpoint_at(out_dir: Path, step: int) -> CheckpointRef | None:
    """The saved checkpoint of `step` in a stage directory (gates name a step)."""
    for path in list_checkpoints(out_dir):
        meta = read_meta(path)
        if meta.step == step:
            return CheckpointRef(path=str(path), step=meta.step, tokens_seen=meta.tokens_seen, sha256=meta.weight_sha256 or "")
    return None


def run_stretches(
    spec: TrainSpec,
    phase_ends: list[tuple[str, int]],
    total: int,
    start: CheckpointRef | None,
    evaluate: Callable[[CheckpointRef], dict],
    tracker: Tracker,
    run_id: str,
    gate=None,
    evaluate_start: bool = False,
    name: str | None = None,
) -> tuple[CheckpointRef, dict | None]:
    """Train from `start` through every mark; returns the checkpoint handed on and the last gate decision.

    The untrained start is evaluated when the stage's gate reads it (relative thresholds, guards,
    patience) or `evaluate_start` (its "before"). `name` is the stage as a person reads it at a gate's
    review and in its failure (SFT's `sft/<sub-stage>`; default `spec.stage`)."""
    logger = get_run_logger()
    ckpt, decision = start, None
    tracker.set_tags(run_id, {"stagewise.stage_dir": spec.out_dir})
    if start is not None and 0 < start.tokens_seen < total:  # resumed mid-stage: keep the history so far
        source = tracker.carry_over(run_id, spec.out_dir, start.step)
        if source:
            logger.info("%s resumes at step %d: metrics up to it carried over from run %s", spec.stage, start.step, source)
    if ((gate is not None and gate.reads_start()) or evaluate_start) and (ckpt is None or ckpt.tokens_seen == 0):
        ckpt = ckpt or train_task(spec, "start", 0, None, tracker, run_id)
        evaluate(ckpt)
    for label, until in marks(phase_ends, gate.eval_every_tokens if gate else None, total):
        if ckpt is not None and ckpt.tokens_seen >= until:
            continue
        ckpt = train_task(spec, label, until, ckpt.path if ckpt else None, tracker, run_id)
        evaluate(ckpt)
        if gate is None:
            continue
        decision = gate_task(gate, tracker, run_id, ckpt.tokens_seen, ckpt.tokens_seen >= total)
        ckpt, decision = reviewed(spec, gate, decision, ckpt, total, evaluate, tracker, run_id, name or spec.stage)
        if decision["action"] == "fail":
            raise GateFailed(name or spec.stage, decision)
        if decision["action"] == "stop":
            named = checkpoint_at(Path(spec.out_dir), decision["step"]) if decision["step"] is not None else None
            logger.info("%s stops at %d tokens: %s", spec.stage, ckpt.tokens_seen, decision["reason"])
            return named or ckpt, decision
    return ckpt, decision


def reviewed(spec: TrainSpec, gate, decision: dict, ckpt: CheckpointRef, total: int, evaluate: Callable[[CheckpointRef], dict],
             tracker: Tracker, run_id: str, name: str) -> tuple[CheckpointRef, dict]:
    """The gate's decision once a person had their say where the gate asks for one (`review`,
    flows/gate_review.py): approve or stop as they answered, or — extend — train the tokens they gave
    past the budget, evaluate, ask the gate again (and them, while it still asks). Each answer is
    recorded on the stage's run as tags; the decision handed on carries the last one."""
    extended = 0
    while gate.asks_person(decision):
        review = ask_person(name, decision, run_url=tracker.ui_url(run_id), budget=total,
                            timeout_s=gate.review_timeout_s, extend_tokens=gate.eval_every_tokens)
        extended += review["extend_tokens"]
        review["extended_tokens"] = extended
        tracker.set_tags(run_id, review_tags(review))
        if review["decision"] != "extend":
            return ckpt, applied(decision, review)
        ckpt = train_task(spec, "extension", ckpt.tokens_seen + review["extend_tokens"], ckpt.path, tracker, run_id,
                          past_budget=True)
        evaluate(ckpt)
        decision = {**gate_task(gate, tracker, run_id, ckpt.tokens_seen, ckpt.tokens_seen >= total), "review": review}
    return ckpt, decision
