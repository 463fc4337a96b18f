"""Prefect tasks that score checkpoints and draw the stage's report."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from transformers import AutoTokenizer

from stagewise.data.chat import prompt_key
from stagewise.data.prepare import PreparedData
from stagewise.data.reasoning_switch import SwitchSetting
from stagewise.data.sft_rows import without_reasoning
from stagewise.data.stats import unigram_cross_entropy
from stagewise.eval.gates import check_metrics, decide
from stagewise.eval.harness import run_checkpoint
from stagewise.eval.heldout import answer_intervals, answer_metrics, answer_results, heldout_loss, read_conversations
from stagewise.eval.intervals import Scored
from stagewise.eval.metric_names import (
    ANSWER_SCORES,
    BOUND_ENDS,
    SUITE_PREFIX,
    UNIGRAM_BASELINE,
    VALIDATION_PREFIX,
    heldout_prefix,
)
from stagewise.eval.plots import loss_curves
from stagewise.eval.splits import split_rows
from stagewise.eval.validation import val_streams, validation_loss
from stagewise.model.build import load_model
from stagewise.refs import CheckpointRef, PreparedRef
from stagewise.store.policy import retrying, run_logger
from stagewise.store.tracking import Tracker


@task(**retrying("validation-loss"))
def validation_task(
    checkpoint: CheckpointRef,
    prepared: PreparedRef,
    seq_length: int,
    max_tokens: int,
    tracker: Tracker | None = None,
    run_id: str | None = None,
    prefix: str = VALIDATION_PREFIX,
    device: str = "cpu",
) -> dict[str, float]:
    """Held-out loss of a checkpoint, per source and overall, next to the unigram baseline.

    Logged as `<prefix>/<name>`; the merge stage scores trained and merged checkpoints with
    prefixes `merge/trained` and `merge/<window>` so they sit side by side in MLflow."""
    model = load_model(Path(checkpoint.path), device=device)
    metrics = validation_loss(model, val_streams(Path(prepared.root)), seq_length, max_tokens, device=device)
    metrics[UNIGRAM_BASELINE] = unigram_cross_entropy(PreparedData.load(Path(prepared.root)))
    run_logger().info(
        "validation loss %.4f (unigram baseline %.4f) at %d tokens",
        metrics["loss"], metrics[UNIGRAM_BASELINE], checkpoint.tokens_seen,
    )
    if tracker and run_id:
        named = {f"{prefix}/{k}": v for k, v in metrics.items()}
        tracker.log_metrics(run_id, [(checkpoint.step, checkpoint.tokens_seen, named)])
    return metrics


@task(**retrying("stage-report"))
def loss_report_task(tracker: Tracker, run_id: str, stage: str) -> None:
    """Plot training and validation loss over tokens and log it as a PNG artifact."""
    client = tracker.client()
    series = {}
    for key in ("train/lm_loss", "eval/validation/loss", "tokens_seen", "train/lr"):
        series[key] = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
    baseline = client.get_metric_history(run_id, "eval/validation/unigram_baseline")
    figure = loss_curves(series, baseline[-1].value if baseline else None, title=f"{stage}: loss over tokens")
    tracker.log_figure(run_id, figure, f"reports/{stage}_loss.png")


@task(**retrying("eval-suite"))
def suite_task(
    checkpoint: CheckpointRef,
    tasks: list[str],
    limit: int | None = None,
    tracker: Tracker | None = None,
    run_id: str | None = None,
    prefix: str = SUITE_PREFIX,
    device: str = "cpu",
) -> dict[str, float]:
    """Run lm-eval tasks on a checkpoint (eval.harness.run_checkpoint): the one suite scorer
    of every stage. Logs `<prefix>/<task>/<metric>` at the checkpoint's step and lm-eval's
    full results as `<prefix>/results_step<step>.json`; the merge stage passes `merge/trained`
    and `merge/<window>` so trained and merged checkpoints sit side by side."""
    result = run_checkpoint(Path(checkpoint.path), tasks, limit=limit, device=device)
    metrics = {f"{prefix}/{k}": v for k, v in result.metrics.items()}
    run_logger().info("%s at %d tokens: %s", prefix, checkpoint.tokens_seen,
                          ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items())))
    if tracker and run_id:
        tracker.log_metrics(run_id, [(checkpoint.step, checkpoint.tokens_seen, metrics)])
        tracker.log_json(run_id, result.raw, f"{prefix}/results_step{checkpoint.step:08d}.json")
    return metrics


@task(**retrying("gate"))
def gate_task(gate, tracker: Tracker, run_id: str, tokens_seen: int, budget_exhausted: bool) -> dict:
    """Ask the gate, from the metrics as MLflow holds them; log the decision and its evidence."""
    check_metrics(gate, tracker.metric_names(run_id))
    decision = decide(gate, tracker.metric_histories(run_id, gate.metrics()),
                      tokens_seen=tokens_seen, budget_exhausted=budget_exhausted)
    out = decision.to_dict()
    tracker.set_tags(run_id, {"stagewise.gate": decision.action, "stagewise.gate_reason": decision.reason[:4000]})
    tracker.log_json(run_id, out, f"gate/decision_{tokens_seen:012d}.json")
    run_logger().info("gate: %s (%s)", decision.action, decision.reason)
    return out


@task(**retrying("heldout-conversations"))
def heldout_task(
    checkpoint: CheckpointRef,
    heldout: str,
    split: str,
    seed: int,
    pack_size: int,
    limit: int | None = None,
    tracker: Tracker | None = None,
    run_id: str | None = None,
    device: str = "cpu",
    switch: SwitchSetting = "auto",
    drop_reasoning: bool = False,
) -> Scored:
    """One split (eval/splits.py: `dev` or `test`, by the recipe's `seed`) of the held-out conversations
    (eval/heldout.py): greedy exact match and SFT loss of a checkpoint, logged as
    `eval/sft_<split>/<metric>` at the checkpoint's step (each rate's 95% interval as `<rate>_low` and
    `<rate>_high`, what a gate's `bound` reads), with each conversation's exact match (the
    items of `eval/sft_<split>/exact_match`; an artifact `heldout/eval/sft_<split>/items_<step>.json`). `switch`: the recipe's
    tokenizer.reasoning_switch (the prompts are written with reasoning off); `drop_reasoning`: the SFT
    data's `reasoning_content: drop` (the loss is taken on the conversations without their traces)."""
    model = load_model(Path(checkpoint.path), device=device)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
    convs = split_rows(read_conversations(heldout), prompt_key, seed)[split]
    if drop_reasoning:
        convs = [without_reasoning(c) for c in convs]
    results = answer_results(model, tokenizer, convs, limit, device=device, switch=switch)
    metrics = answer_metrics(results) | answer_intervals(results) | heldout_loss(model, tokenizer, convs, pack_size,
                                                                                  limit, device=device, switch=switch)
    prefix = heldout_prefix(split)
    named = {f"{prefix}/{k}": v for k, v in metrics.items()}
    items = {f"{prefix}/{name}": {key: r[name] for key, r in results.items()} for name in ANSWER_SCORES} if results else {}
    run_logger().info("held-out conversations (%s) at %d tokens: %s", split, checkpoint.tokens_seen,
                      ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items()) if not k.endswith(BOUND_ENDS)))
    if tracker and run_id:
        tracker.log_metrics(run_id, [(checkpoint.step, checkpoint.tokens_seen, named)])
        if items:
            tracker.log_json(run_id, items, f"heldout/{prefix}/items_{checkpoint.step:08d}.json")
    return Scored(named, items)
